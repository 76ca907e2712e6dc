"""A GGUF file's model description, read without torch or its weights: the HF config its
architecture's reader makes of the metadata (`gguf_config`, `gguf_moe`, `gguf_hybrid`) and the
`ModelConfig` its family parses from it. `GGUFReader` reads a file's description here, and so does
`flexlamps plan`, from the header alone (`gguf_model_spec`: the matrices the engine keeps as the
file's blocks priced at the bytes it holds them in, `gguf_codes`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from flexlamps.cache_folder import cache_root
import placement
from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.description import model_spec
from flexlamps.models.families import families
from flexlamps.models.loading.errors import CheckpointError
from flexlamps.models.loading.gguf_codes import INT4_BLOCK_TYPES, INT8_BLOCK_TYPES, CodeForms, gguf_coded_bytes
from flexlamps.models.loading.gguf_config import DECODER_ARCHITECTURES, as_written, decoder_hf_config
from flexlamps.models.loading.gguf_header import GGUFHeader, open_gguf, read_header
from flexlamps.models.loading.gguf_hybrid import HYBRID_ARCHITECTURES, REFUSED_HYBRID, hybrid_hf_config
from flexlamps.models.loading.gguf_moe import deepseek2_hf_config, gpt_oss_hf_config

_GGUF_FLOAT_TYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # GGML type -> config.json dtype
_PLAIN_FLOATS = ("F32", "F16")  # ggml types a small tensor is read as it lies (numpy's own dtypes)


def field_value(field) -> Any:
    """A header field's value as the `gguf` package decodes it; None where it cannot."""
    try:
        return field.contents()
    except Exception:  # noqa: BLE001  (the package raises assorted errors on fields it cannot decode)
        return None


def parse_header(reader) -> tuple[dict[str, Any], dict[str, str]]:
    """(metadata key -> value, tensor name -> ggml type name) of an open `gguf` reader."""
    return ({k: field_value(f) for k, f in reader.fields.items()},
            {t.name: t.tensor_type.name for t in reader.tensors})


def gguf_config(path: Path, header: GGUFHeader, tensor_values: Callable[[str], list[float]]) -> ModelConfig:
    """The description of the GGUF at `path` from its header; `tensor_values` reads a small tensor's
    values (Phi-3's rope factors). A metadata key llama.cpp's converter writes and the file lacks is a
    CheckpointError naming it."""
    try:
        hf = _arch_hf_config(path, as_written(header.fields), header.tensor_types, tensor_values)
    except KeyError as e:  # a metadata key every converted file of its architecture has
        if not (isinstance(e.args[0], str) and "." in e.args[0] and e.args[0] not in header.fields):
            raise  # not a metadata key the file lacks: our own bug, shown as it is
        raise CheckpointError(f"{path}: GGUF metadata key {e.args[0]!r} is missing (llama.cpp's "
                              "convert_hf_to_gguf.py writes it); convert the model again, or give its "
                              "Hugging Face folder") from None
    # the stored dtype its token embedding (the largest float tensor) has, where that is a float type
    dtype = _GGUF_FLOAT_TYPES.get(header.tensor_types.get("token_embd.weight", ""))
    return ModelConfig.from_hf({**hf, "torch_dtype": dtype} if dtype else hf)


def gguf_model_spec(path: Path, name: str, forms: CodeForms = CodeForms(),
                    cache_dir: Path | None = None) -> placement.ModelSpec:
    """The planner's description of the GGUF at `path` (its family's reading of the metadata), named
    `name`: the matrices the engine keeps as the file's blocks at the bytes `forms` hold them in
    (default: where our kernels run, AVX2's forms; `gguf_codes.coded_nbytes`), the rest in its dtype
    (bf16 where the file holds such blocks, as a run picks it)."""
    cfg, header = _config_and_header(Path(path), cache_dir)
    spec = model_spec(cfg, name=name, coded=gguf_coded_bytes(cfg, header.tensor_types, forms))
    # a file with blocks computed in place runs in bf16 (`--dtype auto`, `RunSettings.resolve_dtype`)
    quantized = any(t in INT4_BLOCK_TYPES + INT8_BLOCK_TYPES for t in header.tensor_types.values())
    return dataclasses.replace(spec, dtype="bf16") if quantized else spec


def _config_and_header(path: Path, cache_dir: Path | None) -> tuple[ModelConfig, GGUFHeader]:
    """The description of the GGUF at `path`, its weights unread, and its header: parsed once and kept
    in `cache_dir` (default: the weight cache's folder), where `GGUFReader` finds it (a 1.1B's header:
    ~5 s to parse and hash the first time)."""
    header = read_header(path, lambda: parse_header(open_gguf(path)), Path(cache_dir) if cache_dir else cache_root())
    return gguf_config(path, header, lambda name: _plain_tensor_values(path, header, name)), header


def _plain_tensor_values(path: Path, header: GGUFHeader, name: str) -> list[float]:
    """A small F32 / F16 tensor's values, read with numpy (the engine's reader dequantizes any type)."""
    kind = header.tensor_types.get(name)
    if kind is None:
        raise CheckpointError(f"{path}: tensor {name} is missing")
    if kind not in _PLAIN_FLOATS:
        raise CheckpointError(f"{path}: tensor {name} is {kind}; its description reads it as F32 or F16 only")
    import numpy as np  # with the gguf package, which imports it anyway

    tensor = next(t for t in open_gguf(path).tensors if t.name == name)
    return [float(v) for v in np.asarray(tensor.data, dtype=np.float64).ravel()]


def _arch_hf_config(path: Path, f: dict[str, Any], tensor_types: dict[str, str],
                    tensor_values: Callable[[str], list[float]]) -> dict[str, Any]:
    arch = f.get("general.architecture")
    if arch == "deepseek2":
        return deepseek2_hf_config(f, set(tensor_types))
    if arch == "gpt-oss":
        return gpt_oss_hf_config(f, tensor_types)
    if arch in HYBRID_ARCHITECTURES or arch in REFUSED_HYBRID:
        return hybrid_hf_config(f, tensor_types)
    if arch not in DECODER_ARCHITECTURES:
        known = sorted({a for fam in families() for a in fam.gguf_architectures})
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported ({', '.join(known)} are; "
                                    "see `flexlamps models`)")
    try:
        return decoder_hf_config(f, tensor_types, tensor_values)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{path}: {e}") from None
