"""Turn a policy's tier fractions into a concrete tier for every weight tensor and cache layer.

Like FlexGen, the split is applied inside each layer: a layer's tensors are walked in order
and each goes to the tier where the middle of its byte range falls, so every layer keeps
about `weights.gpu` of its bytes on the GPU and the I/O per layer is even.
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


def weight_tiers(cfg: ModelConfig, split) -> dict[str, str]:
    groups: dict[int | None, list[WeightSpec]] = {}
    for s in weight_specs(cfg):
        groups.setdefault(s.layer, []).append(s)
    tiers = {}
    for specs in groups.values():
        total = sum(s.numel for s in specs)
        done = 0
        for s in specs:
            tiers[s.name] = _tier_at((done + s.numel / 2) / total, split)
            done += s.numel
    return tiers


def cache_tiers(num_layers: int, split) -> list[str]:
    """Tier per layer's KV cache: the first `split.gpu` of the layers on the GPU, and so on."""
    return [_tier_at((i + 0.5) / num_layers, split) for i in range(num_layers)]
