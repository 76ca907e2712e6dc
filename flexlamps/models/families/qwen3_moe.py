"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): the Qwen3 decoder (per-head q/k RMSNorm) with a softmax
top-k MoE FFN (`norm_topk_prob`), dense on `mlp_only_layers` or off the `decoder_sparse_step`."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model_fields
from flexlamps.models.families.llama import qwen_window
from flexlamps.models.families.moe_weights import qwen_moe_name
from flexlamps.models.families.qwen_moe import QWEN_MOE_FIELDS, qwen_moe
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_qwen3_moe(hf: dict[str, Any]) -> ModelConfig:
    bias = bool(hf.get("attention_bias", False))
    attention = AttentionConfig(qk_norm=True, o_bias=bias, **qwen_window(hf))
    return ModelConfig(**decoder_model_fields(hf, attention=attention, qkv_bias=bias), moe=qwen_moe(hf, shared=False))


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, qwen_moe_name)


FAMILY = Family(
    name="qwen3_moe", model_types=("qwen3_moe",), forward="decoder", parse=_from_qwen3_moe, weights=decoder_specs,
    hf_name=hf_name, gguf_architectures=("qwen3moe",), examples="Qwen3-30B-A3B, Qwen3-235B-A22B",
    reads=QWEN_MOE_FIELDS | {"attention_bias", "max_window_layers", "layer_types"})
