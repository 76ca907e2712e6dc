"""Every landed family's tiny checkpoint under one name (a "kind"): the HF folders the test
builders save (dense, windowed, MoE, MLA, hybrid; a LLaMA in FP8 tiles) and GGUF files in llama.cpp's layouts (dense
LLaMA in Q4_0 ... Q8_0 and the K-quants, MoE with quantized experts, DeepSeek-V2, gpt-oss with
MXFP4 experts, the decoder families tests/decoder_gguf.py writes), each built once per (kind,
vocabulary size) and kept in a folder.

A vocabulary wider than the tiny tokenizer's (`WIDE_VOCAB`) makes the embedding table and the
output head a large share of the model: split across tiers by rows and run in several chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.checkpoints import CHECKPOINTS, GGUF_FIELDS, GGUF_MOE_OVERRIDES, GROUPS, make_checkpoint

TOKENIZER_VOCAB = 320  # save_tiny_tokenizer's vocabulary (the default)
WIDE_VOCAB = 9000  # > HEAD_CHUNK_ROWS: the head runs in two chunks
VOCABS = (None, WIDE_VOCAB)

# dense LLaMA GGUFs, each matrix of one ggml type (K-quants need rows of 256: hidden 256)
_K_MIX = {"attn_v": "Q5_0", "ffn_down": "Q6_K"}  # llama.cpp's Q4_K_M: Q4_K, v and down kept wider
GGUF_LLAMA_TYPES: dict[str, Callable[[str, int | None], str | None]] = {
    "Q4_0": lambda name, layer: None if name.endswith("norm") else "Q4_0",
    "Q4_1": lambda name, layer: None if name.endswith("norm") else "Q4_1",
    "Q5_0": lambda name, layer: None if name.endswith("norm") else "Q5_0",
    "Q5_1": lambda name, layer: None if name.endswith("norm") else "Q5_1",
    "Q8_0": lambda name, layer: None if name.endswith("norm") else "Q8_0",
    "Q4_K_M": lambda name, layer: None if name.endswith("norm") else _K_MIX.get(name, "Q4_K"),
    "Q5_K": lambda name, layer: None if name.endswith("norm") else "Q5_K",
    "Q6_K": lambda name, layer: None if name.endswith("norm") else "Q6_K",
}
GGUF_LLAMA_SHAPE = dict(hidden=256, ffn=512, layers=2, heads=4, kv_heads=2)


def _kinds() -> dict[str, tuple[str, Callable[[Path, dict], Path]]]:
    """kind -> (its model_type, build(folder, overrides) -> checkpoint path)."""
    kinds = {f"tiny:{k}": (CHECKPOINTS[k]["model_type"], lambda f, o, k=k: make_checkpoint(f, k, **o))
             for k in GROUPS["tiny"]}
    for k in GROUPS["family"]:
        for width in ("narrow", "wide"):  # the narrow head tied to the embedding
            kinds[f"family:{k}:{width}"] = (CHECKPOINTS[k]["model_type"], lambda f, o, k=k, w=width: make_checkpoint(
                f, k, wide=w == "wide", tied=w == "narrow", **o))
    for k in GROUPS["moe"]:
        for wide in (False, True):
            kinds[f"moe:{k}:{'wide' if wide else 'narrow'}"] = (
                CHECKPOINTS[k]["model_type"], lambda f, o, k=k, wide=wide: make_checkpoint(f, k, wide=wide, **o))
    for k in (*GROUPS["deepseek"], *GROUPS["hybrid"]):
        group = "deepseek" if k in GROUPS["deepseek"] else "hybrid"
        kinds[f"{group}:{k}"] = (CHECKPOINTS[k]["model_type"], lambda f, o, k=k: make_checkpoint(f, k, **o))
    kinds["tiny:llama_gqa:fp8"] = ("llama", _fp8_llama)  # FP8 tiles, as DeepSeek ships its matrices
    for types in GGUF_LLAMA_TYPES:
        kinds[f"gguf:llama:{types}"] = ("llama", lambda f, o, t=types: _llama_gguf(f, t, o))
    for k in GGUF_MOE_OVERRIDES:
        for experts in (None, "Q8_0", "Q4_0"):
            kinds[f"gguf:{k}:{experts or 'f32'}"] = (k, lambda f, o, k=k, q=experts: _moe_gguf(f, k, q, o))
    for k, gating in (("deepseek_v2", None), ("deepseek_v2_grouped", 1)):
        kinds[f"gguf:{k}"] = ("deepseek_v2", lambda f, o, k=k, g=gating: _deepseek2_gguf(f, k, g, o))
    kinds["gguf:gpt_oss_mxfp4"] = ("gpt_oss", _gpt_oss_gguf)
    for k, spec in GGUF_FIELDS.items():  # llama.cpp's Gemma-2 ties its head: all tied here
        kinds[f"gguf:{k}"] = (spec["model_type"], lambda f, o, k=k: _decoder_gguf(
            make_checkpoint(f / "hf", {**GGUF_FIELDS[k], **o}, tied=True), f))
    for k in ("olmoe", "glm4_moe"):
        kinds[f"gguf:{k}"] = (k, lambda f, o, k=k: _decoder_gguf(make_checkpoint(f / "hf", k, **o), f))
    return kinds


def _fp8_llama(folder: Path, overrides: dict) -> Path:
    from tests.checkpoints import to_fp8_checkpoint

    to_fp8_checkpoint(make_checkpoint(folder / "hf", "llama_gqa", **overrides), folder / "fp8")
    return folder / "fp8"


def _decoder_gguf(hf: Path, folder: Path) -> Path:
    from tests.decoder_gguf import write_decoder_gguf

    return write_decoder_gguf(hf, folder / "model.gguf")


def _llama_gguf(folder: Path, types: str, overrides: dict) -> Path:
    from tests.gguf_models import write_llama_gguf

    if set(overrides) - {"vocab_size"}:  # no HF config behind these files: its other fields cannot be honoured
        raise ValueError(f"gguf:llama:{types} takes a vocab_size alone, not {sorted(set(overrides) - {'vocab_size'})}")
    folder.mkdir(parents=True, exist_ok=True)
    vocab = overrides.get("vocab_size", TOKENIZER_VOCAB)
    return write_llama_gguf(folder / "model.gguf", GGUF_LLAMA_TYPES[types], vocab=vocab, **GGUF_LLAMA_SHAPE)


def _moe_gguf(folder: Path, kind: str, experts: str | None, overrides: dict) -> Path:
    from tests.decoder_gguf import write_decoder_gguf

    hf = make_checkpoint(folder / "hf", kind, **GGUF_MOE_OVERRIDES[kind], **overrides)
    return write_decoder_gguf(hf, folder / "model.gguf", quantize_experts=experts)


def _deepseek2_gguf(folder: Path, kind: str, gating: int | None, overrides: dict) -> Path:
    from tests.moe_gguf import write_deepseek2_gguf

    return write_deepseek2_gguf(make_checkpoint(folder / "hf", kind, **overrides), folder / "model.gguf", gating)


def _gpt_oss_gguf(folder: Path, overrides: dict) -> Path:
    from tests.moe_gguf import write_gpt_oss_gguf

    return write_gpt_oss_gguf(make_checkpoint(folder / "hf", "gpt_oss_mxfp4", **overrides), folder / "model.gguf")


KINDS = _kinds()


class CheckpointZoo:
    """Checkpoints by (kind, vocabulary size), built under `root` on first use and kept."""

    def __init__(self, root: Path):
        self.root, self._built = Path(root), {}

    def path(self, kind: str, vocab: int | None = None) -> Path:
        key = (kind, vocab)
        if key not in self._built:
            folder = self.root / f"{kind.replace(':', '-')}-{vocab or TOKENIZER_VOCAB}"
            self._built[key] = KINDS[kind][1](folder, {} if vocab is None else {"vocab_size": vocab})
        return self._built[key]
