"""OLMo-2 (OLMo-2-0425-1B ... 32B): LLaMA's layer with its norms after each block instead of before
(attention and MLP read the residual as it is; their outputs are RMS-normed before they join it),
and q and k RMS-normed over their whole projection before the rotation (as OLMoE)."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import HF_LAYER, decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.layer_config import AttentionConfig, DecoderConfig
from flexlamps.models.weight_specs import WeightSpec

_HF_LAYER = {**HF_LAYER, "post_attn_norm": "post_attention_layernorm.weight",
             "post_mlp_norm": "post_feedforward_layernorm.weight"}


def _from_olmo2(hf: dict[str, Any]) -> ModelConfig:
    bias = bool(hf.get("attention_bias", False))  # q, k, v and o
    return decoder_model(hf, attention=AttentionConfig(qk_norm=True, qk_norm_full=True, o_bias=bias),
                         decoder=DecoderConfig(sandwich_norms=True, pre_norms=False), qkv_bias=bias)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, layer_names=_HF_LAYER)


FAMILY = Family(
    name="olmo2", model_types=("olmo2",), forward="decoder", parse=_from_olmo2, weights=decoder_specs,
    hf_name=hf_name, examples="OLMo-2 1B/7B/13B/32B", reads=SHAPE_FIELDS | {"attention_bias"})
