"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): the Qwen2 decoder (q/k/v biases) with a softmax
top-k MoE FFN and a shared expert scaled by its sigmoid gate."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.family import Family
from flexlamps.models.families.llama import SHAPE_FIELDS, decoder_fields, decoder_hf_name, decoder_specs
from flexlamps.models.families.moe_weights import ROUTER_TRAINING_FIELDS, qwen_moe_name
from flexlamps.models.moe_config import MoEConfig, sparse_step_layers
from flexlamps.models.weight_specs import WeightSpec


def qwen_moe(hf: dict[str, Any], shared: bool) -> MoEConfig | None:
    """The MoE of Qwen2-MoE (`shared`: with its gated shared expert) and Qwen3-MoE; None without experts."""
    # hub configs say num_experts; transformers 5 saves Qwen3-MoE's as num_local_experts
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    if not experts:
        return None
    shared_width = hf["shared_expert_intermediate_size"] if shared else 0
    return MoEConfig(
        num_experts=experts, num_experts_per_token=hf["num_experts_per_tok"],
        num_shared_experts=1 if shared_width else 0, moe_intermediate_size=hf["moe_intermediate_size"],
        moe_layers=sparse_step_layers(hf), router="softmax_topk",
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        shared_intermediate_size=shared_width, shared_expert_gate=bool(shared_width))


# what Qwen2-MoE and Qwen3-MoE configs share: the MoE fields, the window switch
QWEN_MOE_FIELDS = SHAPE_FIELDS | ROUTER_TRAINING_FIELDS | {
    "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "sliding_window", "use_sliding_window"}


def _from_qwen2_moe(hf: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**decoder_fields(hf, qkv_bias=bool(hf.get("qkv_bias", True))), moe=qwen_moe(hf, shared=True))


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, qwen_moe_name)


FAMILY = Family(
    name="qwen2_moe", model_types=("qwen2_moe",), forward="decoder", parse=_from_qwen2_moe,
    weights=decoder_specs, hf_name=hf_name, gguf_architectures=("qwen2moe",),
    examples="Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B",
    reads=QWEN_MOE_FIELDS | {"qkv_bias", "shared_expert_intermediate_size", "layer_types", "max_window_layers"})
