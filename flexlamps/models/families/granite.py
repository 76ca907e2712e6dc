"""Granite (3.x dense): LLaMA's layer with its multipliers: embeddings times `embedding_multiplier`,
the softmax scale `attention_multiplier`, each block's output times `residual_multiplier`, the
logits divided by `logits_scaling`; biases as LLaMA's."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.layer_config import AttentionConfig, DecoderConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_granite(hf: dict[str, Any]) -> ModelConfig:
    bias = bool(hf.get("attention_bias", False))
    attention = AttentionConfig(scale=float(hf.get("attention_multiplier", 1.0)), o_bias=bias)
    embed_scale = float(hf.get("embedding_multiplier", 1.0))
    decoder = DecoderConfig(embed_scale=embed_scale if embed_scale != 1.0 else None,
                            residual_scale=float(hf.get("residual_multiplier", 1.0)),
                            logit_divisor=float(hf.get("logits_scaling", 1.0)))
    return decoder_model(hf, attention=attention, decoder=decoder, qkv_bias=bias,
                         mlp_bias=bool(hf.get("mlp_bias", False)))


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="granite", model_types=("granite",), forward="decoder", parse=_from_granite, weights=decoder_specs,
    hf_name=hf_name, gguf_architectures=("granite",), examples="Granite-3.x 2B/8B (dense)",
    reads=SHAPE_FIELDS | {"attention_bias", "mlp_bias", "attention_multiplier", "embedding_multiplier",
                          "residual_multiplier", "logits_scaling"})
