"""Shapes nobody tuned for run on our kernels: small GGUFs written by scripts/random_gguf.py in the
block types llama-quantize's Q4_K_M and Q4_0 give them (K-quants where a matrix's inputs fill
blocks of 256, its fallbacks Q5_0 / Q8_0 where they do not), with grouped-query attention, head
dims apart from hidden / heads and q/k/v biases; every matrix is multiplied on its codes in
decode and in prompts (no dense twin, no torch fallback), as the 1.1B benchmark's worker reports
(`off_kernels`), and the engine generates."""

import importlib
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


sys.path.insert(0, str(SCRIPTS))
random_gguf = importlib.import_module("random_gguf")
bench = importlib.import_module("bench_llamacpp_1b")

ODD_ROWS = "tinyllama-1.1b:hidden=128,ffn=160,layers=1,heads=4,kv_heads=1,head_dim=40,vocab=97"
SHAPES = {  # held-out forms at test size: GQA with a head dim of its own; Qwen2's biases on inputs of 96
    "llama-gqa-head96": "llama-3.2-1b:hidden=256,ffn=512,layers=2,heads=4,kv_heads=2,head_dim=96,vocab=256",
    "qwen2-bias-hidden96": "qwen2.5-0.5b:hidden=96,ffn=160,layers=2,heads=3,kv_heads=1,vocab=224",
    # rows that do not fill the kernels' tiles: q/k/v of 160 + 40 + 40 rows, a head of 97 (as a vocab of 32002)
    "llama-odd-rows": ODD_ROWS,
}


def q4_k_m(name: str, cols: int) -> str:
    """llama-quantize's Q4_K_M choice for a matrix (Q6_K for attn_v, ffn_down and the tied table;
    Q5_0 / Q8_0 where the inputs do not fill blocks of 256)."""
    wide = name.endswith(("attn_v.weight", "ffn_down.weight", "token_embd.weight"))
    if cols % 256:
        return "Q8_0" if wide else "Q5_0"
    return "Q6_K" if wide else "Q4_K"


def written(tmp_path: Path, shape_text: str, quant: str) -> Path:
    _, shape = random_gguf.parse_shape(shape_text)
    dims = {name: d for name, d, _ in random_gguf._tensors(shape)}

    def types(name: str) -> str:
        return q4_k_m(name, dims[name][1]) if quant == "Q4_K_M" else "Q4_0"

    return random_gguf.write_random_gguf(tmp_path / f"{quant}.gguf", shape, types=types)


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q4_0"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_held_out_shapes_run_on_the_kernels(tmp_path, shape, quant):
    from flexlamps import LLM, SamplingParams
    from flexlamps.models.blocks.coded_weights import native_kernel

    if native_kernel() is None:
        pytest.skip("no native decode kernel on this CPU")
    llm = LLM(str(written(tmp_path, SHAPES[shape], quant)), dtype="bfloat16", cache_dir=False)
    assert bench.off_kernels(llm.executor) == []
    out = llm.generate_ids([[5, 6, 7, 8]], [SamplingParams(max_new_tokens=3, ignore_eos=True)])
    assert len(out[0].token_ids) == 3


def test_off_kernels_names_what_torch_runs(tmp_path, monkeypatch):
    """Without our kernel every matrix is named, a phase each (the worker's report is not silent)."""
    from flexlamps import LLM
    from flexlamps.models.blocks import coded_weights

    llm = LLM(str(written(tmp_path, SHAPES["qwen2-bias-hidden96"], "Q4_0")), dtype="bfloat16", cache_dir=False)
    monkeypatch.setattr(coded_weights, "native_kernel", lambda: None)
    off = bench.off_kernels(llm.executor)
    assert len(off) == 2 * 4 + 1  # qkv, o, gate_up, down a layer (stacked), and the head
    assert all(line.endswith("decode, prompt") for line in off)


class _Refusing:
    """The decode kernel refusing the weights of `rows` output rows (as one off our kernels would be)."""

    def __init__(self, kernel, rows: int):
        self.kernel, self.rows = kernel, rows

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def takes(self, w):
        return w.shape[0] != self.rows and self.kernel.takes(w)

    def runs(self, w, x):
        return w.shape[0] != self.rows and self.kernel.runs(w, x)

    def takes_prompt(self, w):
        return w.shape[0] != self.rows and self.kernel.takes_prompt(w)

    def runs_prompt(self, w, x):
        return w.shape[0] != self.rows and self.kernel.runs_prompt(w, x)


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q4_0"])
def test_only_a_matrix_off_the_kernels_gets_a_dense_twin(tmp_path, monkeypatch, quant):
    """One matrix the kernels do not take (the output head here) is twinned alone: the others keep
    their codes only, and the model still generates."""
    from flexlamps import LLM, SamplingParams
    from flexlamps.models.blocks import coded_weights
    from flexlamps.models.blocks.coded_weights import Int4Twin

    kernel = coded_weights.native_kernel()
    if kernel is None:
        pytest.skip("no native decode kernel on this CPU")
    monkeypatch.setattr(coded_weights, "native_kernel", lambda: _Refusing(kernel, 97))  # the vocab's rows
    llm = LLM(str(written(tmp_path, ODD_ROWS, quant)), dtype="bfloat16", cache_dir=False)
    off = bench.off_kernels(llm.executor)
    assert len(off) == 1 and off[0].startswith("lm_head (97, 128)") and "with a dense twin" in off[0], off
    weights = list(llm.executor.layer_weights[0].values()) + [llm.executor.global_weights["lm_head"]]
    assert sum(isinstance(w, Int4Twin) for w in weights) == 1
    out = llm.generate_ids([[5, 6, 7, 8]], [SamplingParams(max_new_tokens=3, ignore_eos=True)])
    assert len(out[0].token_ids) == 3


@pytest.mark.parametrize("text, says", [("llama-9b", "no shape named"), ("qwen2.5-0.5b:vocab=x", "takes a number"),
                                        ("qwen2.5-0.5b:heads=5", "multiple of kv_heads"),
                                        ("qwen2.5-0.5b:arch=gpt2", "arch one of")])
def test_a_wrong_shape_is_refused_in_one_line(text, says):
    with pytest.raises(ValueError, match=says):
        random_gguf.parse_shape(text)
