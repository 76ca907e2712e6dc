"""How often a MoE model's tokens route to each expert: measured on the user's own prompts
(`flexlamps profile --model M --prompts FILE`), uniform when not measured.

Two uses: placement puts each layer's hottest experts on the fastest tier (`expert_order`),
and the planner prices the experts a step reads, the expected number of distinct ones its
tokens route to (`expected_distinct`): each of T tokens picks expert e with probability q_e
(the share of measured tokens that picked it; sum over e of q_e is k), so the step reads
sum_e 1 - (1 - q_e)^T of them, which is k at T = 1 and tends to E as T grows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from placement.jsonable import JsonMixin


@dataclass(frozen=True)
class RoutingProfile(JsonMixin):
    """Per MoE layer (its index, as a string in JSON), how many of `tokens` routed tokens
    picked each expert."""

    num_experts: int
    experts_per_token: int
    tokens: int = 0  # tokens routed per layer (0: not measured, uniform)
    counts: dict[str, list[int]] = field(default_factory=dict)
    # per measured sequence, its steps (the prompt's, then each decode step's): per MoE layer, the
    # experts the step routed to; what the expert cache's hits are priced from (`expert_hits`)
    traces: list[list[dict[str, list[int]]]] = field(default_factory=list)

    def __post_init__(self):
        if self.num_experts < 1 or not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"RoutingProfile: {self.experts_per_token} experts per token of {self.num_experts}")
        for layer, row in self.counts.items():
            if len(row) != self.num_experts or min(row, default=0) < 0:
                raise ValueError(f"RoutingProfile: layer {layer} has {len(row)} counts for {self.num_experts} experts")

    @classmethod
    def uniform(cls, num_experts: int, experts_per_token: int) -> "RoutingProfile":
        return cls(num_experts, experts_per_token)

    def pick_shares(self, layer: int) -> list[float]:
        """q_e: the share of tokens that pick each expert of `layer` (they sum to k)."""
        row = self.counts.get(str(layer))
        if row is None or not self.tokens:
            return [self.experts_per_token / self.num_experts] * self.num_experts
        return [c / self.tokens for c in row]

    @cached_property
    def trace_counts(self) -> list[dict[int, Counter]]:
        """Per traced sequence, per MoE layer, how many of its steps routed to each expert."""
        out = []
        for steps in self.traces:
            layers: dict[int, Counter] = {}
            for step in steps:
                for layer, experts in step.items():
                    layers.setdefault(int(layer), Counter()).update(experts)
            out.append(layers)
        return out

    def expert_order(self, layer: int) -> list[int]:
        """The layer's experts, most often routed to first (ties by index)."""
        shares = self.pick_shares(layer)
        return sorted(range(self.num_experts), key=lambda e: (-shares[e], e))

    def expected_distinct(self, layer: int, tokens: float) -> float:
        """Expected distinct experts `tokens` tokens route to in `layer` (`tokens` may be
        fractional: a mean)."""
        return sum(1 - (1 - min(q, 1.0)) ** tokens for q in self.pick_shares(layer))

    def mean_expected_distinct(self, tokens: float, layers) -> float:
        """`expected_distinct` averaged over `layers` (the MoE layers)."""
        layers = list(layers)
        return sum(self.expected_distinct(j, tokens) for j in layers) / len(layers) if layers else 0.0
