"""Qwen3.5 text models (transformers `qwen3_5_text`): Qwen3-Next's hybrid gated-DeltaNet / gated
full-attention layers with a dense SwiGLU MLP, and q/k/v, z, b, a as four projections."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.family import Family
from flexlamps.models.families.hybrid_layers import HYBRID_READS, hybrid_fields, hybrid_hf_name, hybrid_specs


def _from_qwen3_5(hf: dict[str, Any]) -> ModelConfig:
    return ModelConfig(arch="hybrid", **hybrid_fields(hf, fused_projections=False))


FAMILY = Family(
    name="qwen3_5", model_types=("qwen3_5_text",), forward="hybrid", parse=_from_qwen3_5,
    weights=hybrid_specs, hf_name=hybrid_hf_name, gguf_architectures=("qwen35",),
    examples="Qwen3.5 text models (gated DeltaNet + dense MLP)",
    reads=HYBRID_READS)
