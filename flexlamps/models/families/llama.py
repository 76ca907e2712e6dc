"""LLaMA and the families that share its layout: LLaMA-2/3, Mistral, Qwen2, SmolLM2, TinyLlama."""

from __future__ import annotations

from typing import Any, Callable

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import rms_decoder_fields, rope
from flexlamps.models.families.moe_weights import Shapes, ffn_shapes
from flexlamps.models.weight_specs import WeightSpec, head_specs, layer_spec


def decoder_fields(hf: dict[str, Any], qkv_bias: bool | None = None) -> dict[str, Any]:
    """The ModelConfig fields of a LLaMA-like decoder (attention, rope, the dense FFN); families
    over this layout add theirs (`moe`, ...). `qkv_bias`: the family's own flag, when it has one."""
    if hf.get("sliding_window") and hf.get("use_sliding_window", hf["model_type"] in ("mistral", "mixtral")):
        # A window at least as long as the context never masks anything: safe to ignore.
        if hf["sliding_window"] < hf.get("max_position_embeddings", 0):
            raise UnsupportedModelError(
                f"sliding_window={hf['sliding_window']} is not supported; only full attention is"
            )
    heads = hf["num_attention_heads"]
    theta, scaling = rope(hf)
    return dict(
        arch="llama",
        **rms_decoder_fields(hf),
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_position=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=bool(hf.get("attention_bias", hf["model_type"] == "qwen2")) if qkv_bias is None else qkv_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )


def _from_llama(hf: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**decoder_fields(hf))


def attention_shapes(cfg: ModelConfig) -> Shapes:
    """One layer's attention tensors and its norm (the layer's first tensors)."""
    h, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    out: Shapes = [("attn_norm", (h,), "norm"), ("q_proj", (q, h), "linear"), ("k_proj", (kv, h), "linear"),
                   ("v_proj", (kv, h), "linear")]
    if cfg.qkv_bias:
        out += [("q_bias", (q,), "bias"), ("k_bias", (kv,), "bias"), ("v_bias", (kv,), "bias")]
    return out + [("o_proj", (h, q), "linear")]


def decoder_specs(cfg: ModelConfig) -> list[WeightSpec]:
    """Every tensor of a LLaMA-like decoder: per layer attention, the FFN norm, the FFN (dense or MoE)."""
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, cfg.hidden_size), "embed", None)]
    for i in range(cfg.num_layers):
        shapes = attention_shapes(cfg) + [("mlp_norm", (cfg.hidden_size,), "norm")] + ffn_shapes(cfg, i)
        specs += [layer_spec(i, local, shape, role) for local, shape, role in shapes]
    return specs + head_specs(cfg)


HF_LAYER = {
    "attn_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "o_proj": "self_attn.o_proj.weight", "mlp_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
    "gate_bias": "mlp.gate_proj.bias", "up_bias": "mlp.up_proj.bias", "down_bias": "mlp.down_proj.bias",
}
HF_GLOBAL = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight",
                    "lm_head": "lm_head.weight"}


def decoder_hf_name(spec: WeightSpec, moe_name: Callable[[str], str | None] | None = None) -> str:
    """`spec`'s checkpoint name; `moe_name` names the MoE tensors of the family's layout."""
    if spec.layer is None:
        return HF_GLOBAL[spec.name]
    local = spec.local_name
    name = moe_name(local) if moe_name is not None else None
    return f"model.layers.{spec.layer}.{name or HF_LAYER[local]}"


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="llama", model_types=("llama", "mistral", "qwen2"), forward="decoder",
    parse=_from_llama, weights=decoder_specs, hf_name=hf_name, gguf_architectures=("llama", "qwen2"),
    examples="Llama-2/3.x, Mistral-7B (no window), Qwen2/2.5, SmolLM2, TinyLlama")
