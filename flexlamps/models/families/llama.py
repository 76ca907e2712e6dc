"""LLaMA and the families that share its layout: LLaMA-2/3, Mistral, Qwen2, SmolLM2, TinyLlama.

Biases as transformers builds them: LLaMA's `attention_bias` on q, k, v and o, its `mlp_bias` on
gate, up and down; Qwen2 always on q, k, v (never o); Mistral none. Sliding windows: Mistral's
`sliding_window` on every layer; Qwen2's with `use_sliding_window` on the layers `layer_types` (or
`max_window_layers`) say.
"""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import HF_LAYER, decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model, decoder_model_fields, sliding_layers
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.weight_specs import WeightSpec

__all__ = ["FAMILY", "HF_LAYER", "SHAPE_FIELDS", "decoder_fields", "decoder_hf_name", "decoder_specs", "qwen_window"]

# the fields every LLaMA-like config spells alike (read by hf_fields.decoder_model)
SHAPE_FIELDS = frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
                          "tie_word_embeddings", "hidden_act", "rope_parameters", "rope_theta", "rope_scaling",
                          "max_position_embeddings"})


def _from_llama(hf: dict[str, Any]) -> ModelConfig:
    model_type = hf["model_type"]
    if model_type == "qwen2":
        return decoder_model(hf, attention=AttentionConfig(**qwen_window(hf)), qkv_bias=True)
    if model_type == "mistral":  # transformers' Mistral: no biases, one window on every layer
        return decoder_model(hf, attention=AttentionConfig(window=hf.get("sliding_window")))
    bias = bool(hf.get("attention_bias", False))
    return decoder_model(hf, attention=AttentionConfig(o_bias=bias), qkv_bias=bias,
                         mlp_bias=bool(hf.get("mlp_bias", False)))


def decoder_fields(hf: dict[str, Any], qkv_bias: bool | None = None) -> dict[str, Any]:
    """The ModelConfig fields of a decoder over this layout whose family adds its own (`moe`, ...):
    q/k/v biases (`qkv_bias`, or `attention_bias`), `mlp_bias`, the window as Mistral (Mixtral:
    every layer) or Qwen (`use_sliding_window`, `max_window_layers`) spell it."""
    model_type = hf["model_type"]
    if model_type in ("mistral", "mixtral"):
        window = {"window": hf.get("sliding_window")}
    else:
        window = qwen_window(hf) if model_type.startswith("qwen") else {}
    bias = bool(hf.get("attention_bias", False)) if qkv_bias is None else qkv_bias
    return decoder_model_fields(hf, attention=AttentionConfig(**window), qkv_bias=bias,
                                mlp_bias=bool(hf.get("mlp_bias", False)))


def qwen_window(hf: dict[str, Any]) -> dict[str, Any]:
    """Qwen2/Qwen3's window: only with `use_sliding_window`, on the layers from `max_window_layers`."""
    if not hf.get("use_sliding_window"):
        return {}
    first = hf.get("max_window_layers", 28)
    window, layers = sliding_layers(hf, [i >= first for i in range(hf["num_hidden_layers"])])
    return {"window": window, "window_layers": layers}


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="llama", model_types=("llama", "mistral", "qwen2"), forward="decoder",
    parse=_from_llama, weights=decoder_specs, hf_name=hf_name, gguf_architectures=("llama", "qwen2"),
    examples="Llama-2/3.x, Mistral-7B (sliding window), Qwen2/2.5, SmolLM2, TinyLlama",
    reads=SHAPE_FIELDS | {"attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "max_window_layers",
                          "layer_types", "pretraining_tp"})
