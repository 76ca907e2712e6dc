"""Phi-3 / Phi-4-mini: LLaMA's layer with q/k/v and gate/up stacked in the checkpoint (`qkv_proj`,
`gate_up_proj`, read as they are: the decoder block runs stacked projections already), LongRoPE,
partial rotation (`partial_rotary_factor`), and a sliding window on every layer when configured."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_phi3(hf: dict[str, Any]) -> ModelConfig:
    return decoder_model(_longrope_spelled(hf), attention=AttentionConfig(window=hf.get("sliding_window")),
                         rope_types=("longrope",))


def _longrope_spelled(hf: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's early configs name LongRoPE "su" (or "yarn"); transformers reads both as "longrope"."""
    for field in ("rope_parameters", "rope_scaling"):
        params = hf.get(field)
        if params and params.get("rope_type", params.get("type")) in ("su", "yarn"):
            params = {k: v for k, v in params.items() if k != "type"}
            return {**hf, field: {**params, "rope_type": "longrope"}}
    return hf


def _phi3_specs(cfg: ModelConfig) -> list[WeightSpec]:
    return decoder_specs(cfg, stacked=True)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="phi3", model_types=("phi3",), forward="decoder", parse=_from_phi3, weights=_phi3_specs,
    hf_name=hf_name, gguf_architectures=("phi3",),
    examples="Phi-3-mini/medium (4k, 128k LongRoPE), Phi-3.5-mini, Phi-4-mini",
    # embd_pdrop / resid_pdrop: dropout, off at inference
    reads=SHAPE_FIELDS | {"sliding_window", "original_max_position_embeddings", "partial_rotary_factor",
                          "embd_pdrop", "resid_pdrop"})
