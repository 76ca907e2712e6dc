"""DeepSeek-V3 mixture-of-experts FFN: sigmoid router with group-limited top-k, routed experts
plus always-on shared experts.

Routing, as transformers' `DeepseekV3TopkRouter` runs it: sigmoid scores in fp32; a
per-expert correction bias is added for the choice only; experts are split into `num_groups`
groups, each group scored by the sum of its two best biased scores, and only the
`topk_groups` best groups compete; the top `num_experts_per_token` experts win. Their
unbiased scores, normalized to sum to one when `norm_topk_prob`, times
`routed_scaling_factor`, weight their outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.linear import linear, unpack
from flexlamps.models.mla_config import MoEConfig


def route(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor,
          cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, hidden) -> (weights (N, k) fp32, expert indices (N, k))."""
    scores = F.linear(x.float(), unpack(router).float()).sigmoid()  # (N, E)
    choice = scores + bias.float()
    per_group = cfg.num_experts // cfg.num_groups
    group_scores = choice.view(-1, cfg.num_groups, per_group).topk(2, dim=-1).values.sum(-1)  # (N, G)
    best_groups = group_scores.topk(cfg.topk_groups, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_scores).scatter_(1, best_groups, 1.0)
    expert_mask = group_mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(-1, cfg.num_experts)
    choice = choice.masked_fill(expert_mask == 0, float("-inf"))
    indices = choice.topk(cfg.num_experts_per_token, dim=-1, sorted=False).indices
    weights = scores.gather(1, indices)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, indices


def swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


def moe_ffn(w: dict[str, torch.Tensor], x: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """The MoE FFN of one layer on x (n, T, hidden); expert e's weights are
    `experts.{e}.gate_proj` / `up_proj` / `down_proj`, the shared ones `shared_*`."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])  # (N, hidden)
    weights, indices = route(flat, w["router"], w["router_bias"], cfg)
    out = torch.zeros_like(flat)
    # each expert runs once on the tokens that chose it, in expert order
    for expert in indices.unique().tolist():
        token_idx, slot_idx = torch.where(indices == expert)
        pre = f"experts.{expert}."
        y = swiglu(flat[token_idx], w[pre + "gate_proj"], w[pre + "up_proj"], w[pre + "down_proj"])
        out.index_add_(0, token_idx, (y * weights[token_idx, slot_idx, None]).to(out.dtype))
    out = out.view(shape)
    if cfg.num_shared_experts:
        out = out + swiglu(x, w["shared_gate_proj"], w["shared_up_proj"], w["shared_down_proj"])
    return out
