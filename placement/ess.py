"""ESS at DeepSeek-V3.2 scale: decode batch and throughput with the latent cache offloaded.

The setting of ESS (seed 000): DeepSeek-V3.2-Exp decode on 8 GPUs (data-parallel attention),
MTP with 1.7 accepted tokens per step, per GPU a fixed budget for the caches. Without
offload every token keeps its FP8 latent (656 B) and indexer key (132 B) per layer on the
GPU. With offload the indexer keys stay, the latents live on the CPU, and a GPU pool per
layer holds some entries per sequence; each step copies the misses over PCIe (ESS's
FlashTrans: 37 GB/s for scattered 656 B entries), overlapped with the indexer and the
attention over the hits for part of each layer's time.

Per-step compute is `StepCost`: a fixed part plus a part per sequence that grows with the
context (the indexer reads every key). Its three numbers are fitted (least squares) to the
step times implied by ESS's four published operating points, so the batch sizes, pool
sizes and transfer volumes are what this module predicts. The fitted per-context-token
cost, 3.4 ns per sequence, is reading 61 layers x 132 B of indexer keys at 2.4 TB/s — an
H800's HBM at 70%, a sanity check on the fit.

The cache budget is the one ESS's baseline implies: 52 sequences of 32K (equally 13 of 128K)
fully cached. `plan_global` picks one pool fraction for all layers (ESS's rho); `plan_per_layer`
sizes each layer's pool by an LP (scipy HiGHS) over the layers' miss curves, batch size
enumerated outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from placement.latent_traces import MissCurve

def pool_entries(index_topk: int, gpu_fraction: float, context: int) -> int:
    """Entries per sequence in each layer's gpu pool when a policy keeps `gpu_fraction` of the
    latent cache on the gpu tier: that share of the context, but at least one step's top-k
    (what the engine's offloaded latent cache allocates)."""
    return max(min(index_topk, context), round(gpu_fraction * context))


# ESS's decode results (their table): context -> (batch, tokens/s) without and with offload, rho
ESS_TABLE = {
    32768: dict(base_batch=52, base_tokens_per_s=9647.0, ess_batch=160, ess_tokens_per_s=16347.0, rho=0.21),
    131072: dict(base_batch=13, base_tokens_per_s=3669.0, ess_batch=54, ess_tokens_per_s=8169.0, rho=0.10),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EssDeployment:
    num_layers: int = 61
    topk: int = 2048  # entries each query attends to
    latent_bytes: int = 656  # FP8 latent record per token per layer
    indexer_bytes: int = 132  # FP8 indexer key per token per layer (always on the GPU)
    num_gpus: int = 8
    tokens_per_step: float = 1.7  # MTP=2 with ESS's acceptance ratio
    h2d_bytes_per_s: float = 37e9  # ESS's FlashTrans, scattered entries
    cache_budget_bytes: float = 52 * 32768 * 61 * (656 + 132)  # per GPU, from ESS's 32K baseline
    overlap_share: float = 0.3  # share of a layer's time a miss copy can hide behind

    def baseline_batch(self, context: int) -> int:
        """Sequences that fit with every latent on the GPU."""
        per_seq = context * self.num_layers * (self.latent_bytes + self.indexer_bytes)
        return int(self.cache_budget_bytes // per_seq)

    def pool_entries_budget(self, batch: int, context: int) -> float:
        """Pool entries per sequence, summed over layers, left beside the indexer keys and a
        double-buffered staging area for one layer's misses."""
        indexer = batch * context * self.num_layers * self.indexer_bytes
        staging = 2 * batch * self.topk * self.latent_bytes
        return (self.cache_budget_bytes - indexer - staging) / (batch * self.latent_bytes)

    def tokens_per_s(self, batch: int, step_s: float) -> float:
        return self.num_gpus * batch * self.tokens_per_step / step_s


@dataclass(frozen=True, slots=True)
class StepCost:
    """Decode step compute seconds = fixed + batch * (per_seq + context * per_seq_per_token)."""

    fixed_s: float
    per_seq_s: float
    per_seq_per_token_s: float

    def seconds(self, batch: int, context: int) -> float:
        return self.fixed_s + batch * (self.per_seq_s + context * self.per_seq_per_token_s)

    @classmethod
    def fit_ess(cls, deployment: EssDeployment) -> "StepCost":
        """Least-squares fit to the step times of ESS's four operating points."""
        rows, times = [], []
        for context, row in ESS_TABLE.items():
            for batch, tps in ((row["base_batch"], row["base_tokens_per_s"]), (row["ess_batch"], row["ess_tokens_per_s"])):
                rows.append([1.0, batch, batch * context])
                times.append(deployment.num_gpus * batch * deployment.tokens_per_step / tps)
        fixed, per_seq, per_token = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)[0]
        return cls(float(fixed), float(per_seq), float(per_token))


@dataclass(frozen=True)
class PoolPlan:
    batch: int
    pool_entries: tuple[float, ...]  # per layer, entries per sequence
    misses: tuple[float, ...]  # per layer, per sequence per step (LRU)
    compute_s: float
    exposed_transfer_s: float
    tokens_per_s: float

    @property
    def entries_moved_per_step(self) -> float:
        """Latent entries copied to the GPU per step, all sequences and layers."""
        return sum(self.misses) * self.batch


def _exposed_s(dep: EssDeployment, batch: int, misses: list[float], compute_s: float) -> float:
    """Transfer time not hidden: per layer, copies beyond its overlap window."""
    window = dep.overlap_share * compute_s / dep.num_layers
    per_entry = batch * dep.latent_bytes / dep.h2d_bytes_per_s
    return sum(max(0.0, m * per_entry - window) for m in misses)


def _plan(dep, cost, curves, batch, context, pools) -> PoolPlan:
    misses = [c.misses(p) for c, p in zip(curves, pools)]
    compute = cost.seconds(batch, context)
    exposed = _exposed_s(dep, batch, misses, compute)
    return PoolPlan(batch, tuple(pools), tuple(misses), compute, exposed,
                    dep.tokens_per_s(batch, compute + exposed))


def plan_global(dep: EssDeployment, cost: StepCost, curves: list[MissCurve], context: int, *,
                rho: float | None = None) -> PoolPlan:
    """Best batch with one pool fraction for every layer: the given rho, or the largest that
    fits each batch (a bigger pool never misses more)."""
    best = None
    for batch in range(1, 4 * dep.baseline_batch(context) + 64):
        room = dep.pool_entries_budget(batch, context) / dep.num_layers
        fraction = rho if rho is not None else min(1.0, room / context)
        pool = fraction * context
        if pool < dep.topk or pool > room + 1e-9:
            continue
        plan = _plan(dep, cost, curves, batch, context, [pool] * dep.num_layers)
        if best is None or plan.tokens_per_s > best.tokens_per_s:
            best = plan
    return best


def _lower_hull(xs: tuple[int, ...], ys: tuple[float, ...]) -> list[tuple[float, float]]:
    """Vertices of the convex lower envelope of a decreasing miss curve."""
    hull: list[tuple[float, float]] = []
    for x, y in zip(xs, ys):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):  # middle point above the chord
                hull.pop()
            else:
                break
        hull.append((float(x), float(y)))
    return hull


def solve_pools(dep: EssDeployment, curves: list[MissCurve], batch: int, context: int,
                compute_s: float) -> list[float] | None:
    """Per-layer pool sizes minimizing exposed transfer time (LP over the curves' convex
    hulls): variables pool_l and exposed_l; exposed_l >= per_entry * misses_l(pool_l) - window."""
    num = len(curves)
    budget = dep.pool_entries_budget(batch, context)
    if budget < num * dep.topk:
        return None
    per_entry = batch * dep.latent_bytes / dep.h2d_bytes_per_s
    window = dep.overlap_share * compute_s / dep.num_layers
    rows, rhs = [], []
    for layer, curve in enumerate(curves):
        hull = _lower_hull(curve.pool_entries, curve.lru)
        for (x1, y1), (x2, y2) in zip(hull, hull[1:] or hull):
            slope = 0.0 if x2 == x1 else (y2 - y1) / (x2 - x1)
            row = np.zeros(2 * num)
            row[layer], row[num + layer] = per_entry * slope, -1.0
            rows.append(row)
            rhs.append(window - per_entry * (y1 - slope * x1))
    rows.append(np.concatenate([np.ones(num), np.zeros(num)]))
    rhs.append(budget)
    top = [min(context, c.pool_entries[-1]) for c in curves]
    bounds = [(dep.topk, t) for t in top] + [(0, None)] * num
    c = np.concatenate([np.full(num, 1e-12), np.ones(num)])  # tiny pressure: no pool wasted
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=bounds, method="highs")
    return list(res.x[:num]) if res.status == 0 else None


def plan_per_layer(dep: EssDeployment, cost: StepCost, curves: list[MissCurve], context: int) -> PoolPlan:
    """Best batch with each layer's pool sized by `solve_pools`."""
    best = None
    for batch in range(1, 4 * dep.baseline_batch(context) + 64):
        compute = cost.seconds(batch, context)
        pools = solve_pools(dep, curves, batch, context, compute)
        if pools is None:
            continue
        plan = _plan(dep, cost, curves, batch, context, pools)
        if best is None or plan.tokens_per_s > best.tokens_per_s:
            best = plan
    return best


def baseline_tokens_per_s(dep: EssDeployment, cost: StepCost, context: int) -> tuple[int, float]:
    batch = dep.baseline_batch(context)
    return batch, dep.tokens_per_s(batch, cost.seconds(batch, context))


def gain(plan: PoolPlan, base_tokens_per_s: float) -> float:
    return plan.tokens_per_s / base_tokens_per_s - 1.0

