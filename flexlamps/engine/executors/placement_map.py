"""Turn a policy's tier fractions into a concrete tier for every weight tensor and cache layer.

Like FlexGen, the split is applied inside each layer: a layer's tensors are walked in order
and each goes to the tier where the middle of its byte range falls, so every layer keeps
about `weights.gpu` of its bytes on the GPU and the I/O per layer is even. Unlike FlexGen,
what one group (the global tensors, then each layer) rounds off is carried into the next
group's target, so each tier holds its planned share of all the weights to within about one
tensor: the bytes the planner counted are the bytes the budgets are charged.
"""

from __future__ import annotations

from flexlamps.models.config import ModelConfig
from flexlamps.models.weight_specs import WeightSpec, weight_specs


def _tier_at(point: float, split) -> str:
    if point < split.gpu:
        return "gpu"
    if point < split.gpu + split.cpu:
        return "cpu"
    return "disk"


def weight_tiers(cfg: ModelConfig, split, size_of=None) -> dict[str, str]:
    """Tier of every weight tensor. `size_of(spec)`: the bytes it is stored in (default: its
    element count), so that shares are shares of stored bytes, as the planner counts them
    (compressed matrices shrink, embedding tables do not)."""
    size_of = size_of or (lambda spec: spec.numel)
    groups: dict[int | None, list[WeightSpec]] = {}
    for s in weight_specs(cfg):
        groups.setdefault(s.layer, []).append(s)
    order = sorted(groups, key=lambda layer: -1 if layer is None else layer)  # globals first
    tiers = {}
    seen = on_gpu = on_gpu_or_cpu = 0  # bytes walked, and placed on the gpu / gpu+cpu tiers
    debt = (0.0, 0.0)  # what the global tensors rounded off, paid back evenly over the layers
    for index, layer in enumerate(order):
        specs = groups[layer]
        seen += sum(size_of(s) for s in specs)
        # this group's share of each boundary, plus what earlier groups rounded off (the
        # globals' rounding spread over the layers, so every layer streams about as much)
        left = 1 - index / (len(order) - 1) if len(order) > 1 and index else 0.0
        gpu_end = split.gpu * seen - on_gpu - debt[0] * left
        cpu_end = (split.gpu + split.cpu) * seen - on_gpu_or_cpu - debt[1] * left
        done = 0
        for s in specs:
            size = size_of(s)
            middle = done + size / 2
            tiers[s.name] = "gpu" if middle < gpu_end else "cpu" if middle < cpu_end else "disk"
            on_gpu += size if tiers[s.name] == "gpu" else 0
            on_gpu_or_cpu += size if tiers[s.name] != "disk" else 0
            done += size
        if layer is None:
            debt = (split.gpu * seen - on_gpu, (split.gpu + split.cpu) * seen - on_gpu_or_cpu)
    return tiers


def cache_tiers(num_layers: int, split) -> list[str]:
    """Tier per layer's KV cache: the first `split.gpu` of the layers on the GPU, and so on."""
    return [_tier_at((i + 0.5) / num_layers, split) for i in range(num_layers)]
