"""Mixtral (8x7B, 8x22B): the Mistral decoder with a softmax top-k MoE FFN on every layer."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.family import Family
from flexlamps.models.families.llama import SHAPE_FIELDS, decoder_fields, decoder_hf_name, decoder_specs
from flexlamps.models.families.moe_weights import ROUTER_TRAINING_FIELDS, mixtral_moe_name
from flexlamps.models.moe_config import MoEConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_mixtral(hf: dict[str, Any]) -> ModelConfig:
    moe = MoEConfig(
        num_experts=hf["num_local_experts"], num_experts_per_token=hf["num_experts_per_tok"],
        num_shared_experts=0, moe_intermediate_size=hf["intermediate_size"],
        moe_layers=(True,) * hf["num_hidden_layers"], router="softmax_topk", norm_topk_prob=True)
    return ModelConfig(**decoder_fields(hf), moe=moe)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, mixtral_moe_name)


FAMILY = Family(
    name="mixtral", model_types=("mixtral",), forward="decoder", parse=_from_mixtral,
    weights=decoder_specs, hf_name=hf_name, gguf_architectures=("llama",),
    examples="Mixtral-8x7B, Mixtral-8x22B",
    reads=SHAPE_FIELDS | ROUTER_TRAINING_FIELDS | {"num_local_experts", "num_experts_per_tok", "sliding_window"})
