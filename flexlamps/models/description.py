"""The planner's view of a model (`placement.ModelSpec` and its `placement.TensorTable`), built
from our one model description (`ModelConfig`, parsed by its family) so `plan`, the dry run and the
engine size the same model. Torch-free."""

from __future__ import annotations

import dataclasses
from typing import Any

import placement
from placement.specs import DTYPE_BYTES
from placement.tensor_table import TensorRow, TensorTable
from quant.fp8_layout import fp8_weight_bytes

from flexlamps.models.config import ModelConfig
from flexlamps.models.weight_specs import WeightSpec, keeps_fp8, weight_specs


def model_spec(cfg: ModelConfig, name: str | None = None, coded: dict[str, int] | None = None) -> placement.ModelSpec:
    """`cfg` as the planner sizes it (its stored dtype and format from `cfg.storage`), named `name`
    (default: its model type); `coded`: {weight name: bytes} of the matrices kept as the
    checkpoint's blocks (a GGUF's codes), at the bytes their kind holds them in (`tensor_table`)."""
    kwargs: dict[str, Any] = dict(
        name=name or cfg.model_type, arch=cfg.arch,
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size, dtype=cfg.storage.dtype,
        tie_word_embeddings=cfg.tie_word_embeddings, weight_format=cfg.storage.weight_format,
        tensors=tensor_table(cfg, coded=coded))
    if cfg.mla is not None:
        kwargs.update(_mla_fields(cfg))
    if cfg.moe is not None:
        kwargs.update(_moe_fields(cfg))
    if cfg.hybrid is not None:
        kwargs.update(_hybrid_fields(cfg))
    if cfg.attention.sinks or cfg.attention.softcap is not None:  # the exact fp32 path runs its attention
        kwargs["exact_attention"] = True
    if cfg.attention.window is not None:  # each layer's window (0: it attends over the whole context)
        kwargs["layer_windows"] = tuple(cfg.attention.layer_window(i) or 0 for i in range(cfg.num_layers))
    return placement.ModelSpec(**kwargs)


def with_codes(model: placement.ModelSpec, cfg: ModelConfig, coded: dict[str, int]) -> placement.ModelSpec:
    """`model` (the planner's view of `cfg`, in any dtype) with the matrices in `coded` kept as the
    checkpoint's blocks at those bytes (`tensor_table`'s "codes" rows)."""
    return dataclasses.replace(model, tensors=tensor_table(cfg, coded=coded))


def _hybrid_fields(cfg: ModelConfig) -> dict[str, Any]:
    hy = cfg.hybrid
    return dict(num_linear_layers=len(hy.linear_layers), linear_num_key_heads=hy.num_key_heads,
                linear_num_value_heads=hy.num_value_heads, linear_key_head_dim=hy.key_head_dim,
                linear_value_head_dim=hy.value_head_dim, linear_conv_kernel=hy.conv_kernel)


def _mla_fields(cfg: ModelConfig) -> dict[str, Any]:
    m = cfg.mla
    return dict(num_kv_heads=cfg.num_heads, head_dim=m.qk_nope_head_dim, q_lora_rank=m.q_lora_rank,
                kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim,
                index_num_heads=m.index_num_heads, index_head_dim=m.index_head_dim, index_topk=m.index_topk)


def _moe_fields(cfg: ModelConfig) -> dict[str, Any]:
    moe = cfg.moe
    dense = sum(1 for is_moe in moe.moe_layers if not is_moe)
    return dict(num_experts=moe.num_experts, num_experts_per_token=moe.num_experts_per_token,
                num_shared_experts=moe.num_shared_experts, moe_intermediate_size=moe.moe_intermediate_size,
                num_dense_layers=dense, shared_intermediate_size=moe.shared_intermediate_size)


# ---- the per-tensor table ------------------------------------------------------------------------
def encoding(cfg: ModelConfig, spec: WeightSpec) -> str:
    """How the checkpoint keeps `spec`: FP8 for the matrices an FP8 checkpoint keeps so (not the
    routers, as DeepSeek ships them), MXFP4 for gpt-oss's experts, else dense."""
    st = cfg.storage
    if st.fp8_block is not None and keeps_fp8(spec) and spec.role != "router":
        return "fp8"
    if st.mxfp4 and spec.role == "linear" and spec.layer is not None and spec.local_name.startswith("experts."):
        return "mxfp4"
    return "dense"


def stored_bytes(cfg: ModelConfig, spec: WeightSpec, dtype: str | None = None) -> int:
    """Bytes of `spec` as its checkpoint keeps it (`dtype`: a dense tensor's instead of the stored
    dtype's): FP8 codes and a fp32 scale per tile, MXFP4 blocks (4-bit codes, a byte per 32)."""
    kind = encoding(cfg, spec)
    if kind == "fp8":
        return fp8_weight_bytes(*spec.shape, cfg.storage.fp8_block)
    if kind == "mxfp4":
        return spec.numel // 2 + spec.numel // 32
    return spec.numel * DTYPE_BYTES[dtype or cfg.storage.dtype]


def _row_key(cfg: ModelConfig, spec: WeightSpec, dtype: str | None, head: str, coded: dict[str, int]) -> tuple:
    """(name, shape, kind, routed, encoding, stored bytes, flops per token) of `spec`; a routed
    expert's name without its index, so a layer's experts share one row. A token spends 2 FLOPs
    on each weight of a layer (a multiply and an add; a norm's or bias's elementwise work counted
    alike) and of the output head; the embedding is looked up. A matrix in `coded` is "codes" at
    its bytes there."""
    local, routed = spec.local_name, spec.local_name.startswith("experts.")
    name = "experts." + local.split(".", 2)[2] if routed else local
    spent = spec.layer is not None or spec.name == head
    enc, nbytes = ("codes", coded[spec.name]) if spec.name in coded else (encoding(cfg, spec),
                                                                          stored_bytes(cfg, spec, dtype))
    return name, spec.shape, spec.role, routed, enc, nbytes, 2.0 * spec.numel if spent else 0.0


def tensor_table(cfg: ModelConfig, dtype: str | None = None, coded: dict[str, int] | None = None) -> TensorTable:
    """Every weight of `cfg` (its family's list) as the planner's table: a row per tensor of a layer,
    the layers holding it alike sharing it, a layer's routed experts one row of `copies`; `dtype`:
    the unquantized tensors' bytes in it instead of the stored dtype (a run's compute dtype);
    `coded`: {weight name: bytes} of the matrices the engine keeps as the checkpoint's blocks (a
    GGUF's, `models.loading.gguf_codes`), rows of encoding "codes", and a tied head kept as the
    table's blocks under "lm_head" a row of its own beside the dense table."""
    coded = dict(coded or {})
    specs = weight_specs(cfg)
    head = "lm_head" if any(s.name == "lm_head" for s in specs) else "embed_tokens"  # what the head multiplies
    copies: dict[tuple, int] = {}  # (row key, layer) -> copies in that layer
    for spec in specs:
        key = (_row_key(cfg, spec, dtype, head, coded), spec.layer)
        copies[key] = copies.get(key, 0) + 1
    layers: dict[tuple, list[int]] = {}  # (row key, copies) -> layers
    for (key, layer), n in copies.items():
        layers.setdefault((key, n), []).extend([] if layer is None else [layer])
    per_token = cfg.moe.num_experts_per_token if cfg.moe is not None else 0
    rows = [TensorRow(name=name, shape=shape, kind=kind, routed=routed, encoding=enc, stored_bytes=nbytes,
                      flops_per_token=flops, layers=tuple(held), copies=n, active=per_token if routed else n)
            for ((name, shape, kind, routed, enc, nbytes, flops), n), held in layers.items()]
    if head == "embed_tokens" and "lm_head" in coded:  # the tied head's blocks, beside the table (its FLOPs there)
        table = next(s for s in specs if s.name == "embed_tokens")
        rows.append(TensorRow(name="lm_head", shape=table.shape, kind="embed", encoding="codes",
                              stored_bytes=coded["lm_head"]))
    return TensorTable(num_layers=cfg.num_layers, dtype=dtype or cfg.storage.dtype, rows=tuple(rows))
