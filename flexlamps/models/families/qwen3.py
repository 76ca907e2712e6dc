"""Qwen3 (dense): LLaMA's layout with an RMSNorm on each head's q and k before the rotation;
`attention_bias` on q, k, v and o; Qwen2's sliding-window rule."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model
from flexlamps.models.families.llama import SHAPE_FIELDS, qwen_window
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_qwen3(hf: dict[str, Any]) -> ModelConfig:
    bias = bool(hf.get("attention_bias", False))
    return decoder_model(hf, attention=AttentionConfig(qk_norm=True, o_bias=bias, **qwen_window(hf)), qkv_bias=bias)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="qwen3", model_types=("qwen3",), forward="decoder", parse=_from_qwen3, weights=decoder_specs,
    hf_name=hf_name, gguf_architectures=("qwen3",), examples="Qwen3-0.6B ... Qwen3-32B (dense)",
    reads=SHAPE_FIELDS | {"attention_bias", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
