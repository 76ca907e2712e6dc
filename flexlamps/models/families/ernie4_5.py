"""ERNIE-4.5 (dense, e.g. ERNIE-4.5-0.3B): LLaMA's layer with its rotary pairs interleaved
((x0, x1), (x2, x3), ...) and `use_bias` on every projection (q, k, v, o and the MLP)."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_ernie(hf: dict[str, Any]) -> ModelConfig:
    bias = bool(hf.get("use_bias", False))
    return decoder_model(hf, attention=AttentionConfig(rope_interleaved=True, o_bias=bias), qkv_bias=bias,
                         mlp_bias=bias)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="ernie4_5", model_types=("ernie4_5",), forward="decoder", parse=_from_ernie, weights=decoder_specs,
    hf_name=hf_name, examples="ERNIE-4.5-0.3B (dense)", reads=SHAPE_FIELDS | {"use_bias"})
