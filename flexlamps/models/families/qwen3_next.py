"""Qwen3-Next (transformers `qwen3_next`): three gated-DeltaNet layers to one gated full-attention
layer, a softmax top-k MoE with a sigmoid-gated shared expert (Qwen2-MoE's, `blocks.moe`); q/k/v/z
and b/a projections grouped per key head in two matrices."""

from __future__ import annotations

import dataclasses
from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.family import Family
from flexlamps.models.families.hybrid_layers import HYBRID_READS, hybrid_fields, hybrid_hf_name, hybrid_specs
from flexlamps.models.families.qwen_moe import qwen_moe


def _from_qwen3_next(hf: dict[str, Any]) -> ModelConfig:
    moe = qwen_moe(hf, shared=bool(hf.get("shared_expert_intermediate_size")))
    if moe is not None:  # Qwen3NextConfig's default, unlike Qwen2-MoE's
        moe = dataclasses.replace(moe, norm_topk_prob=bool(hf.get("norm_topk_prob", True)))
    return ModelConfig(arch="hybrid", **hybrid_fields(hf, fused_projections=True), moe=moe)


FAMILY = Family(
    name="qwen3_next", model_types=("qwen3_next",), forward="hybrid", parse=_from_qwen3_next,
    weights=hybrid_specs, hf_name=hybrid_hf_name, gguf_architectures=("qwen3next",),
    examples="Qwen3-Next-80B-A3B (gated DeltaNet + MoE)",
    # (output_router_logits and router_aux_loss_coef only shape transformers' training loss)
    reads=HYBRID_READS | {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                          "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
                          "output_router_logits", "router_aux_loss_coef"})
