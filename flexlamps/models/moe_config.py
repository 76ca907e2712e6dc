"""`MoEConfig`: a mixture-of-experts FFN as data (torch-free), read from each family's config.json.

The kinds of router (`ROUTERS`), as transformers computes them (`blocks/moe.py` runs them):
- "softmax_topk": softmax over all experts, the top k, renormalized when `norm_topk_prob`
  (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE);
- "sigmoid_grouped": sigmoid scores, a per-expert correction bias for the choice only, groups
  ranked by their two best biased scores (DeepSeek-V3, GLM-4.5);
- "softmax_greedy" / "softmax_group_limited": softmax, the top k of all experts or of the
  `topk_groups` groups with the best single score (DeepSeek-V2's `topk_method`);
- "topk_softmax": logits with a bias, the top k, softmax over those k (gpt-oss).
Experts are SwiGLU (`silu(gate) * up`) or gpt-oss's clamped form with biases ("clamped_swiglu").
Shared experts (always on) have one total width; Qwen2-MoE scales theirs by a sigmoid gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROUTERS = ("softmax_topk", "sigmoid_grouped", "softmax_greedy", "softmax_group_limited", "topk_softmax")
EXPERT_KINDS = ("swiglu", "clamped_swiglu")
# router kinds whose logits transformers computes in fp32 whatever the model's dtype
FP32_ROUTERS = ("sigmoid_grouped", "softmax_greedy", "softmax_group_limited")


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    num_experts: int  # routed experts per MoE layer
    num_experts_per_token: int
    num_shared_experts: int  # always-on experts (their total width is shared_intermediate_size)
    moe_intermediate_size: int  # width of one routed expert
    moe_layers: tuple[bool, ...]  # per layer: MoE FFN (True) or the dense FFN (False)
    router: str = "sigmoid_grouped"
    num_groups: int = 1  # grouped routers pick `topk_groups` groups of experts first
    topk_groups: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    shared_intermediate_size: int = -1  # total width of the shared experts; -1: num_shared * moe width
    shared_expert_gate: bool = False  # Qwen2-MoE: shared output times sigmoid(x @ gate)
    experts: str = "swiglu"
    expert_bias: bool = False  # gpt-oss: biases on every expert projection
    swiglu_alpha: float = 1.702  # clamped_swiglu: glu = gate * sigmoid(alpha * gate)
    swiglu_limit: float = 7.0  # clamped_swiglu: gate <= limit, |up| <= limit

    def __post_init__(self):
        if self.router not in ROUTERS:
            raise ValueError(f"MoEConfig.router must be one of {ROUTERS}, got {self.router!r}")
        if self.experts not in EXPERT_KINDS:
            raise ValueError(f"MoEConfig.experts must be one of {EXPERT_KINDS}, got {self.experts!r}")
        if self.shared_intermediate_size < 0:
            object.__setattr__(self, "shared_intermediate_size", self.num_shared_experts * self.moe_intermediate_size)

    @property
    def router_bias(self) -> bool:
        """Whether the router has a per-expert bias (DeepSeek-V3's correction bias, gpt-oss's logit bias)."""
        return self.router in ("sigmoid_grouped", "topk_softmax")

    @property
    def has_shared(self) -> bool:
        return self.shared_intermediate_size > 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MoEConfig":
        return cls(**{**d, "moe_layers": tuple(d["moe_layers"])})


def leading_dense_layers(num_layers: int, first_dense: int) -> tuple[bool, ...]:
    """MoE on every layer after the first `first_dense` (DeepSeek's, GLM's `first_k_dense_replace`)."""
    return tuple(i >= first_dense for i in range(num_layers))


def sparse_step_layers(hf: dict[str, Any]) -> tuple[bool, ...]:
    """Qwen-MoE's choice: MoE on layers not in `mlp_only_layers` whose index + 1 is a multiple
    of `decoder_sparse_step`."""
    step = hf.get("decoder_sparse_step") or 1
    dense = set(hf.get("mlp_only_layers") or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(hf["num_hidden_layers"]))


def moe_from_hf(hf: dict[str, Any]) -> MoEConfig | None:
    """DeepSeek-V3's MoE (None for a dense model); raises KeyError naming a missing field."""
    num_experts = hf.get("n_routed_experts") or 0
    if not num_experts:
        return None
    types = hf.get("mlp_layer_types")
    if types:
        moe_layers = tuple(t == "sparse" for t in types)
    else:
        moe_layers = leading_dense_layers(hf["num_hidden_layers"], hf.get("first_k_dense_replace") or 0)
    return MoEConfig(
        num_experts=num_experts,
        num_experts_per_token=hf["num_experts_per_tok"],
        num_shared_experts=hf.get("n_shared_experts") or 0,
        moe_intermediate_size=hf["moe_intermediate_size"],
        moe_layers=moe_layers,
        num_groups=hf.get("n_group") or 1,
        topk_groups=hf.get("topk_group") or 1,
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
    )
