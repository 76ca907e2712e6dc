"""LLaMA and the families that share its layout: LLaMA-2/3, Mistral, Qwen2, SmolLM2, TinyLlama."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import rms_decoder_fields, rope
from flexlamps.models.weight_specs import WeightSpec, head_specs, layer_spec


def _from_llama(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("sliding_window") and hf.get("use_sliding_window", hf["model_type"] == "mistral"):
        # A window at least as long as the context never masks anything: safe to ignore.
        if hf["sliding_window"] < hf.get("max_position_embeddings", 0):
            raise UnsupportedModelError(
                f"sliding_window={hf['sliding_window']} is not supported; only full attention is"
            )
    heads = hf["num_attention_heads"]
    hidden = hf["hidden_size"]
    theta, scaling = rope(hf)
    return ModelConfig(
        arch="llama",
        **rms_decoder_fields(hf),
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        max_position=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=bool(hf.get("attention_bias", hf["model_type"] == "qwen2")),
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )


def _llama_specs(cfg: ModelConfig) -> list[WeightSpec]:
    h, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, h), "embed", None)]
    for i in range(cfg.num_layers):
        specs += [
            layer_spec(i, "attn_norm", (h,), "norm"),
            layer_spec(i, "q_proj", (q, h), "linear"),
            layer_spec(i, "k_proj", (kv, h), "linear"),
            layer_spec(i, "v_proj", (kv, h), "linear"),
        ]
        if cfg.qkv_bias:
            specs += [layer_spec(i, "q_bias", (q,), "bias"), layer_spec(i, "k_bias", (kv,), "bias"),
                      layer_spec(i, "v_bias", (kv,), "bias")]
        specs += [
            layer_spec(i, "o_proj", (h, q), "linear"),
            layer_spec(i, "mlp_norm", (h,), "norm"),
            layer_spec(i, "gate_proj", (f, h), "linear"),
            layer_spec(i, "up_proj", (f, h), "linear"),
            layer_spec(i, "down_proj", (h, f), "linear"),
        ]
        if cfg.mlp_bias:
            specs += [layer_spec(i, "gate_bias", (f,), "bias"), layer_spec(i, "up_bias", (f,), "bias"),
                      layer_spec(i, "down_bias", (h,), "bias")]
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


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    if spec.layer is None:
        return HF_GLOBAL[spec.name]
    return f"model.layers.{spec.layer}.{HF_LAYER[spec.local_name]}"


FAMILY = Family(
    name="llama", model_types=("llama", "mistral", "qwen2"), forward="decoder",
    parse=_from_llama, weights=_llama_specs, hf_name=hf_name, gguf_architectures=("llama", "qwen2"),
    examples="Llama-2/3.x, Mistral-7B (no window), Qwen2/2.5, SmolLM2, TinyLlama")
