"""OLMoE (OLMoE-1B-7B): a LLaMA-like decoder whose q and k are RMS-normed over their whole
projection (all heads at once) before the rotation, and a softmax top-k MoE FFN on every layer."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model_fields, refuse_true
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.families.moe_weights import ROUTER_TRAINING_FIELDS, qwen_moe_name
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.moe_config import MoEConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_olmoe(hf: dict[str, Any]) -> ModelConfig:
    refuse_true(hf, "clip_qkv")
    bias = bool(hf.get("attention_bias", False))  # q, k, v and o
    moe = MoEConfig(num_experts=hf.get("num_experts") or hf["num_local_experts"],
                    num_experts_per_token=hf["num_experts_per_tok"], num_shared_experts=0,
                    moe_intermediate_size=hf["intermediate_size"], moe_layers=(True,) * hf["num_hidden_layers"],
                    router="softmax_topk", norm_topk_prob=bool(hf.get("norm_topk_prob", False)))
    attention = AttentionConfig(qk_norm=True, qk_norm_full=True, o_bias=bias)
    return ModelConfig(**decoder_model_fields(hf, attention=attention, qkv_bias=bias), moe=moe)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, qwen_moe_name)


FAMILY = Family(
    name="olmoe", model_types=("olmoe",), forward="decoder", parse=_from_olmoe, weights=decoder_specs,
    hf_name=hf_name, gguf_architectures=("olmoe",), examples="OLMoE-1B-7B",
    reads=SHAPE_FIELDS | ROUTER_TRAINING_FIELDS | {"attention_bias", "clip_qkv", "num_experts", "num_local_experts",
                                                   "num_experts_per_tok", "norm_topk_prob"})
