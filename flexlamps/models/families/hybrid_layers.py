"""What Qwen3-Next and Qwen3.5 share (torch-free): the config fields of a hybrid gated-DeltaNet /
full-attention decoder, each layer's tensors (our names, shapes, roles) and their checkpoint names.

Roles as in `weight_specs`: the convolution taps, A_log, dt_bias and the norms are small vectors
kept as stored ("norm"); the FFN (dense or MoE) is the routers work's (`moe_weights`).
"""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.hf_fields import rms_decoder_fields, rope
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.families.moe_weights import ffn_shapes, qwen_moe_name
from flexlamps.models.hybrid_config import HybridConfig, layer_types_from_hf
from flexlamps.models.weight_specs import WeightSpec, head_specs, layer_spec

# transformers' default when a config names no partial_rotary_factor (its __post_init__ sets it)
DEFAULT_PARTIAL_ROTARY = 0.25
# the config.json fields `hybrid_fields` reads (Family.reads)
HYBRID_READS = SHAPE_FIELDS | {"attention_bias", "layer_types", "full_attention_interval", "partial_rotary_factor",
                               "linear_conv_kernel_dim", "linear_key_head_dim", "linear_num_key_heads",
                               "linear_num_value_heads", "linear_value_head_dim"}


def hybrid_fields(hf: dict[str, Any], *, fused_projections: bool) -> dict[str, Any]:
    """ModelConfig keywords of a hybrid decoder; UnsupportedModelError names an option we do not run."""
    if hf.get("attention_bias"):
        raise UnsupportedModelError(f"attention_bias=true is not supported for {hf['model_type']}")
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"hidden_act {hf['hidden_act']!r} is not supported for {hf['model_type']} (silu is)")
    theta, _ = rope(hf, allowed=())  # default rope only; text positions make Qwen3.5's mrope plain rope
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    head_dim = hf.get("head_dim") or hidden // heads
    partial = (hf.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                    hf.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY))
    try:
        types = layer_types_from_hf(hf)
    except ValueError as e:
        raise UnsupportedModelError(f"{hf['model_type']}: {e}") from None
    hybrid = HybridConfig(
        layer_types=types, num_key_heads=hf["linear_num_key_heads"], num_value_heads=hf["linear_num_value_heads"],
        key_head_dim=hf["linear_key_head_dim"], value_head_dim=hf["linear_value_head_dim"],
        conv_kernel=hf.get("linear_conv_kernel_dim", 4), rotary_dim=int(head_dim * partial),
        fused_projections=fused_projections)
    if hybrid.num_value_heads % hybrid.num_key_heads:
        raise UnsupportedModelError(f"linear_num_value_heads {hybrid.num_value_heads} is not a multiple of "
                                    f"linear_num_key_heads {hybrid.num_key_heads}")
    return dict(**rms_decoder_fields(hf), num_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
                max_position=hf.get("max_position_embeddings", 32768), rope_theta=theta, hybrid=hybrid)


def _mixer_shapes(cfg: ModelConfig, layer: int) -> list[tuple[str, tuple[int, ...], str]]:
    hy, h = cfg.hybrid, cfg.hidden_size
    if not hy.is_linear(layer):  # q_proj holds each head's query and its output gate
        return [("q_proj", (2 * cfg.q_size, h), "linear"), ("k_proj", (cfg.kv_size, h), "linear"),
                ("v_proj", (cfg.kv_size, h), "linear"), ("q_norm", (cfg.head_dim,), "norm"),
                ("k_norm", (cfg.head_dim,), "norm"), ("o_proj", (h, cfg.q_size), "linear")]
    heads = hy.num_value_heads
    if hy.fused_projections:
        proj = [("in_proj_qkvz", (hy.conv_dim + hy.value_dim, h), "linear"), ("in_proj_ba", (2 * heads, h), "linear")]
    else:
        proj = [("in_proj_qkv", (hy.conv_dim, h), "linear"), ("in_proj_z", (hy.value_dim, h), "linear"),
                ("in_proj_b", (heads, h), "linear"), ("in_proj_a", (heads, h), "linear")]
    return proj + [("conv1d", (hy.conv_dim, 1, hy.conv_kernel), "norm"), ("A_log", (heads,), "norm"),
                   ("dt_bias", (heads,), "norm"), ("linear_norm", (hy.value_head_dim,), "norm"),
                   ("out_proj", (h, hy.value_dim), "linear")]


def hybrid_specs(cfg: ModelConfig) -> list[WeightSpec]:
    h = cfg.hidden_size
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, h), "embed", None)]
    for i in range(cfg.num_layers):
        shapes = [("attn_norm", (h,), "norm")] + _mixer_shapes(cfg, i) + [("mlp_norm", (h,), "norm")]
        specs += [layer_spec(i, local, shape, role) for local, shape, role in shapes + ffn_shapes(cfg, i)]
    return specs + head_specs(cfg)


_HF_LAYER = {
    "attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
    **{p: f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")},
    **{p: f"linear_attn.{p}.weight" for p in ("in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z",
                                               "in_proj_b", "in_proj_a", "conv1d", "out_proj")},
    "A_log": "linear_attn.A_log", "dt_bias": "linear_attn.dt_bias", "linear_norm": "linear_attn.norm.weight",
    **{p: f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")},
}
_HF_GLOBAL = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}


def hybrid_hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    if spec.layer is None:
        return _HF_GLOBAL[spec.name]
    local = spec.local_name
    return f"model.layers.{spec.layer}.{qwen_moe_name(local) or _HF_LAYER[local]}"
