"""Sparse-attention selection traces and the miss curves of a GPU pool over them.

`synthetic_trace` draws what a lightning indexer picks step after step when the true model
cannot run (DeepSeek-V3.2 at 61 layers and 32K-128K context): each position has a lasting
importance (`persistence` times a normal draw) plus a part that drifts from step to step (an
AR(1) process with correlation `correlation`); each step selects the top-k positions. A
correlation near 1 means the same entries come back (few misses), a low one means churn.
ESS reports, at a pool of 20% of the context at 32K, between 16.66 and 605 misses per layer
per step across DeepSeek-V3.2-Exp's layers; `calibrated_correlations` picks one correlation
per layer so the synthetic layers span that range (the only numbers taken from ESS; a curve
measured on a real model replaces all of this, see `MissCurve`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placement.eviction import belady_misses, lru_misses
from placement.latent_pools import LatentMissCurves

WARMUP_STEPS = 8  # ESS warms its LRU with the prefill's last top-k before decode counts misses


def synthetic_trace(context: int, topk: int, steps: int, correlation: float, *,
                    persistence: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    """`steps` selections of `topk` positions out of `context` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    importance = persistence * rng.standard_normal(context)
    drift = rng.standard_normal(context)
    noise_scale = np.sqrt(1.0 - correlation ** 2)
    trace = []
    for _ in range(steps):
        drift = correlation * drift + noise_scale * rng.standard_normal(context)
        trace.append(np.sort(np.argpartition(-(importance + drift), topk)[:topk]))
    return trace


@dataclass(frozen=True)
class MissCurve:
    """One layer's misses per decode step per sequence, by pool size (entries per sequence)."""

    pool_entries: tuple[int, ...]  # ascending
    lru: tuple[float, ...]  # mean misses per step with an LRU pool of that size
    belady: tuple[float, ...]  # the offline-optimal pool's (a lower bound)

    def misses(self, pool_entries: float, rule: str = "lru") -> float:
        """Misses at any pool size, linear between the measured sizes."""
        values = self.lru if rule == "lru" else self.belady
        return float(np.interp(pool_entries, self.pool_entries, values))


def miss_curve(trace: list[np.ndarray], context: int, pool_sizes: list[int]) -> MissCurve:
    """Mean misses per step after the warm-up steps, for each pool size, LRU and Belady."""
    def mean(counts: np.ndarray) -> float:
        return float(counts[WARMUP_STEPS:].mean())

    sizes = sorted(set(pool_sizes))
    return MissCurve(
        pool_entries=tuple(sizes),
        lru=tuple(mean(lru_misses(trace, context, size)) for size in sizes),
        belady=tuple(mean(belady_misses(trace, context, size)) for size in sizes))


def calibrated_correlations(targets: list[float], context: int, topk: int, pool_entries: int, *,
                            steps: int = 24, grid: int = 16) -> list[float]:
    """Per target miss count (LRU, at `pool_entries`), the correlation whose trace gives it:
    misses are measured on a grid of correlations and interpolated (they fall as it rises)."""
    churn = np.geomspace(5e-4, 0.8, grid)  # 1 - correlation, ascending
    misses = [miss_curve(synthetic_trace(context, topk, steps, 1.0 - c, seed=i), context, [pool_entries]).lru[0]
              for i, c in enumerate(churn)]
    misses = np.maximum.accumulate(np.asarray(misses))  # enforce the monotone trend against noise
    return [float(1.0 - np.exp(np.interp(t, misses, np.log(churn)))) for t in targets]


ESS_MISS_RANGE = (16.66, 605.0)  # ESS: misses per layer per step at a 20% pool, 32K context
POOL_FRACTIONS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)  # where curves are measured


def ess_layer_curves(num_layers: int, topk: int, contexts: list[int], steps: int = 24) -> dict[int, list[MissCurve]]:
    """Per context, one miss curve per layer from synthetic traces whose LRU misses at a 20%
    pool and 32K context span ESS's per-layer range (log-spaced over the layers)."""
    targets = list(np.geomspace(*ESS_MISS_RANGE, num_layers))
    correlations = calibrated_correlations(targets, 32768, topk, int(0.2 * 32768), steps=steps)
    out = {}
    for context in contexts:
        sizes = sorted({max(topk, int(f * context)) for f in POOL_FRACTIONS})
        out[context] = [miss_curve(synthetic_trace(context, topk, steps, a, seed=layer), context, sizes)
                        for layer, a in enumerate(correlations)]
    return out


def ess_miss_curves(num_layers: int = 61, topk: int = 2048, context: int = 32768, steps: int = 24):
    """ESS's per-layer curves as the planner reads them (`placement.latent_pools`): pool sizes
    and misses as fractions of the context and of the top-k."""
    curves = ess_layer_curves(num_layers, topk, [context], steps=steps)[context]
    return LatentMissCurves(
        source=f"ESS's curves: synthetic traces calibrated to ESS's per-layer misses ({ESS_MISS_RANGE[0]}-"
               f"{ESS_MISS_RANGE[1]:g} at a 20% pool), {num_layers} layers, top-k {topk}, {context} context",
        pool_fractions=[size / context for size in curves[0].pool_entries],
        miss_fractions=[[m / topk for m in curve.lru] for curve in curves])
