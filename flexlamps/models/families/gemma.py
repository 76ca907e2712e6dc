"""Gemma-2 and Gemma-3 (text): (1 + w) RMSNorms, a norm after attention and one on each side of the
MLP, embeddings times sqrt(hidden) (rounded to the weights' dtype), GELU (tanh), the softmax scale
query_pre_attn_scalar ** -0.5, sliding-window layers among global ones. Gemma-2 soft-caps the
attention scores and the final logits; Gemma-3 norms each head's q and k and turns its sliding
layers with their own rope (`rope_local_base_freq`, or `rope_parameters.sliding_attention`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.decoder_layout import HF_LAYER, SANDWICH_HF_LAYER, decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model, refuse_true, rope, sliding_layers
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.layer_config import ROPE_TYPES, AttentionConfig, DecoderConfig
from flexlamps.models.weight_specs import WeightSpec

_HF_LAYER = {**HF_LAYER, **SANDWICH_HF_LAYER}
_GLOBAL_THETA, _LOCAL_THETA = 1_000_000.0, 10_000.0  # Gemma-3's defaults (transformers' default_theta)


def _from_gemma(hf: dict[str, Any]) -> ModelConfig:
    refuse_true(hf, "use_bidirectional_attention")
    gemma3 = hf["model_type"] == "gemma3_text"
    layers = hf["num_hidden_layers"]
    pattern = hf.get("sliding_window_pattern", 6) if gemma3 else 2  # every pattern-th layer is global
    window, window_layers = sliding_layers(hf, [(i + 1) % pattern != 0 for i in range(layers)])
    bias = bool(hf.get("attention_bias", False))
    attention = AttentionConfig(scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
                                softcap=hf.get("attn_logit_softcapping"), window=window, window_layers=window_layers,
                                qk_norm=gemma3, o_bias=bias)
    decoder = DecoderConfig(norm_plus_one=True, sandwich_norms=True, embed_scale=hf["hidden_size"] ** 0.5,
                            embed_scale_rounded=True, logit_softcap=hf.get("final_logit_softcapping"))
    if gemma3:
        hf, attention = _gemma3_ropes(hf, attention)
    return decoder_model(hf, attention=attention, decoder=decoder, qkv_bias=bias, activation_field="hidden_activation")


def _gemma3_ropes(hf: dict[str, Any], attention: AttentionConfig) -> tuple[dict[str, Any], AttentionConfig]:
    """Gemma-3's two ropes: the global one as the model's (`rope_parameters.full_attention`, or
    rope_theta + rope_scaling), the sliding layers' own (`.sliding_attention`, or rope_local_base_freq)."""
    params = hf.get("rope_parameters") or {}
    nested = isinstance(params.get("full_attention"), dict) or isinstance(params.get("sliding_attention"), dict)
    if params and not nested:
        raise UnsupportedModelError("gemma3_text rope_parameters must be nested by layer type "
                                    "(full_attention, sliding_attention)")
    full = dict(params.get("full_attention") or {"rope_type": "default", **(hf.get("rope_scaling") or {})})
    full.setdefault("rope_theta", hf.get("rope_theta", _GLOBAL_THETA))
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    local.setdefault("rope_theta", hf.get("rope_local_base_freq", _LOCAL_THETA))
    local_theta, local_scaling = rope(hf, ROPE_TYPES, params=local)
    types = hf.get("layer_types")
    local_layers = (tuple(t == "sliding_attention" for t in types) if types is not None else
                    tuple((i + 1) % hf.get("sliding_window_pattern", 6) != 0 for i in range(hf["num_hidden_layers"])))
    global_hf = {**{k: v for k, v in hf.items() if k not in ("rope_scaling", "rope_theta")}, "rope_parameters": full}
    return global_hf, dataclasses.replace(attention, local_rope_theta=local_theta, local_rope_scaling=local_scaling,
                                          local_rope_layers=local_layers)


def _gemma_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return decoder_specs(cfg)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, layer_names=_HF_LAYER)


FAMILY = Family(
    name="gemma", model_types=("gemma2", "gemma3_text"), forward="decoder", parse=_from_gemma,
    weights=_gemma_specs, hf_name=hf_name, gguf_architectures=("gemma2", "gemma3"),
    examples="Gemma-2 2B/9B/27B, Gemma-3 1B (text)",
    reads=SHAPE_FIELDS | {"attention_bias", "attn_logit_softcapping", "final_logit_softcapping", "hidden_activation",
                          "layer_types", "query_pre_attn_scalar", "sliding_window", "sliding_window_pattern",
                          "use_bidirectional_attention", "rope_local_base_freq"})
