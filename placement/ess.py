"""ESS at DeepSeek-V3.2 scale: decode batch and throughput with the latent cache offloaded.

The setting of ESS (seed 000, arXiv 2512.10576): DeepSeek-V3.2-Exp decode, 8 GPUs with
data-parallel attention, MTP=2 with 1.7 accepted tokens per step, per GPU a fixed budget for
the caches. Without offload every token keeps its FP8 latent (656 B) and indexer key (132 B)
per layer on the GPU. With offload the indexer keys stay, the latents live on the CPU, and a
GPU pool per layer holds some entries per sequence (LRU); each step copies the misses over
PCIe (FlashTrans: 37 GB/s for scattered 656 B entries, UVA straight into the pool).

What ESS models, and so what this module models:
  - step compute (`StepCost`): ESS's simulator replays measured operator times and fills the
    points between by linear interpolation. The measured points we have are its published
    ones: per context, the baseline (no copies) and the offloaded point; the step is linear in
    the batch through them, net of the copy time this model leaves exposed at the latter.
  - overlap (`_overlap`): DA overlap splits the sparse attention into the part over entries
    already on the GPU, run while the misses arrive, and the rest; DBA also splits the
    indexer by batch so that about half of it overlaps. The attention's time is its FLOPs at
    FlashMLA's published FP8 sparse-decode rate (410 TFLOP/s on H800); the indexer's is the
    part of the per-sequence step that grows with the context (it reads every key). What a
    layer's copy needs beyond that window is exposed.
  - memory: the cache budget ESS's baseline implies (52 sequences of 32K, equally 13 of
    128K, fully cached); with offload, indexer keys plus the pools must fit it.

`plan_global` picks one pool fraction for all layers (ESS's rho); `plan_per_layer` sizes each
layer's pool by an LP (scipy HiGHS) over the layers' miss curves, batch size enumerated
outside.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from placement.latent_pools import lower_hull
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
    queries_per_step: int = 2  # MTP=2: each step verifies the next token and one draft
    tokens_per_step: float = 1.7  # tokens accepted per step (ESS's acceptance ratio at MTP=2)
    h2d_bytes_per_s: float = 37e9  # ESS's FlashTrans, scattered entries
    cache_budget_bytes: float = 52 * 32768 * 61 * (656 + 132)  # per GPU, from ESS's 32K baseline
    # sparse MLA decode, absorbed: scores over latent+rope (576), output in the latent (512)
    num_heads: int = 128
    score_dim: int = 576
    value_dim: int = 512
    attention_flops_per_s: float = 410e12  # FlashMLA's FP8 sparse decode kernel on H800 (its README)
    indexer_overlap: float = 0.5  # ESS's DBA splits the indexer by batch: about half overlaps the copies
    # ESS's DA: the misses arrive while attention runs over the hits; False: the copy, then the
    # attention (flexlamps' exact decode); True with indexer_overlap 0: flexlamps' overlapped decode
    hits_overlap: bool = True

    def baseline_batch(self, context: int) -> int:
        """Sequences that fit with every latent on the GPU."""
        per_seq = context * self.num_layers * (self.latent_bytes + self.indexer_bytes)
        return int(self.cache_budget_bytes // per_seq)

    def pool_entries_budget(self, batch: int, context: int) -> float:
        """Pool entries per sequence, summed over layers, left beside the indexer keys. FlashTrans
        (UVA) writes the misses straight into the slots LRU frees, so no staging area is held."""
        indexer = batch * context * self.num_layers * self.indexer_bytes
        return (self.cache_budget_bytes - indexer) / (batch * self.latent_bytes)

    def tokens_per_s(self, batch: int, step_s: float) -> float:
        return self.num_gpus * batch * self.tokens_per_step / step_s

    def step_s(self, batch: int, tokens_per_s: float) -> float:
        """The decode step time a published throughput implies."""
        return self.num_gpus * batch * self.tokens_per_step / tokens_per_s

    def attention_s_per_layer(self, batch: int) -> float:
        """One layer's sparse attention over the top-k for the whole batch."""
        flops = 2 * self.num_heads * self.topk * (self.score_dim + self.value_dim) * self.queries_per_step
        return batch * flops / self.attention_flops_per_s


def _linear(x: float, xs: tuple[int, ...], ys: tuple[float, ...]) -> float:
    """Piecewise-linear through (xs, ys), extended past the ends along the end segments."""
    idx = min(max(int(np.searchsorted(xs, x)), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[idx - 1], xs[idx], ys[idx - 1], ys[idx]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class StepCost:
    """Decode step compute. ESS's simulator replays operator times measured on real machines,
    filling the points between by linear interpolation; here the measured points are its
    published ones. At each published context the step is `fixed + batch * per_seq`, the line
    through ESS's baseline (no copies) and its offloaded point (less the copy time this model
    leaves exposed there); between contexts both are linear in the context. What grows with
    the context per sequence is the indexer, which reads every key (attention reads the top-k)."""

    contexts: tuple[int, ...]
    fixed_s: tuple[float, ...]
    per_seq_s: tuple[float, ...]

    def seconds(self, batch: int, context: int) -> float:
        return (_linear(context, self.contexts, self.fixed_s)
                + batch * _linear(context, self.contexts, self.per_seq_s))

    def indexer_s_per_seq_token(self) -> float:
        """Indexer seconds per step per sequence per context token (all layers)."""
        return (self.per_seq_s[-1] - self.per_seq_s[0]) / (self.contexts[-1] - self.contexts[0])

    @classmethod
    def through(cls, dep: EssDeployment, exposed_s: dict[int, float]) -> "StepCost":
        """Lines through ESS's two points at each context, its offloaded step less `exposed_s`."""
        contexts = tuple(sorted(ESS_TABLE))
        fixed, per_seq = [], []
        for context in contexts:
            row = ESS_TABLE[context]
            base_s = dep.step_s(row["base_batch"], row["base_tokens_per_s"])
            ess_s = dep.step_s(row["ess_batch"], row["ess_tokens_per_s"]) - exposed_s[context]
            per_seq.append((ess_s - base_s) / (row["ess_batch"] - row["base_batch"]))
            fixed.append(base_s - row["base_batch"] * per_seq[-1])
        return cls(contexts, tuple(fixed), tuple(per_seq))

    @classmethod
    def fit_ess(cls, dep: EssDeployment, curves: dict[int, list[MissCurve]], *,
                tolerance_s: float = 1e-12, max_rounds: int = 200) -> "StepCost":
        """`through` ESS's points, with the copy time exposed at its offloaded points (its batch
        and rho, these miss curves) found by fixed-point iteration (it depends on the indexer's
        share of the step, which depends on the lines)."""
        exposed = {context: 0.0 for context in ESS_TABLE}
        for _ in range(max_rounds):
            cost = cls.through(dep, exposed)
            previous, exposed = exposed, {
                context: plan_global_at(dep, cost, curves[context], context, row["ess_batch"],
                                        row["rho"]).exposed_transfer_s
                for context, row in ESS_TABLE.items()}
            if max(abs(exposed[c] - previous[c]) for c in exposed) < tolerance_s:
                break
        return cls.through(dep, exposed)


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


def _overlap(dep: EssDeployment, cost: StepCost, batch: int, context: int) -> tuple[float, float]:
    """(seconds of one layer's copy a miss per sequence costs, the part of a layer's window
    that does not depend on its misses). ESS's DA overlap runs the attention over the entries
    already on the GPU while the misses arrive; its DBA overlap also splits the indexer by
    batch so that about half of it overlaps. Window = attention * (1 - misses / topk) +
    indexer_overlap * indexer, written as fixed - per-miss share of the attention."""
    copy_per_miss = batch * dep.latent_bytes / dep.h2d_bytes_per_s
    if not dep.hits_overlap:
        return copy_per_miss, 0.0
    attention = dep.attention_s_per_layer(batch)
    indexer = batch * context * cost.indexer_s_per_seq_token() / dep.num_layers
    per_miss = copy_per_miss + attention / dep.topk
    return per_miss, attention + dep.indexer_overlap * indexer


def _exposed_s(dep: EssDeployment, cost: StepCost, batch: int, context: int, misses: list[float]) -> float:
    """Transfer time not hidden: per layer, the copy beyond its overlap window."""
    per_miss, window = _overlap(dep, cost, batch, context)
    return sum(max(0.0, m * per_miss - window) for m in misses)


def _plan(dep, cost, curves, batch, context, pools) -> PoolPlan:
    misses = [c.misses(p) for c, p in zip(curves, pools)]
    compute = cost.seconds(batch, context)
    exposed = _exposed_s(dep, cost, batch, context, misses)
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


def plan_global_at(dep: EssDeployment, cost: StepCost, curves: list[MissCurve], context: int,
                   batch: int, rho: float) -> PoolPlan:
    """One batch and pool fraction, whether or not it fits the budget."""
    return _plan(dep, cost, curves, batch, context, [rho * context] * dep.num_layers)


def hull_pieces(curve: MissCurve) -> list[tuple[float, float]]:
    """(slope, intercept) of each segment of the curve's convex lower envelope: the misses at
    pool size p are at least `slope * p + intercept` for every piece (exact on the hull), so a
    minimizing LP can carry them as linear rows."""
    hull = lower_hull(curve.pool_entries, curve.lru)
    pieces = []
    for (x1, y1), (x2, y2) in zip(hull, hull[1:] or hull):
        slope = 0.0 if x2 == x1 else (y2 - y1) / (x2 - x1)
        pieces.append((slope, y1 - slope * x1))
    return pieces


def solve_pools(dep: EssDeployment, cost: StepCost, curves: list[MissCurve], batch: int,
                context: int) -> list[float] | None:
    """Per-layer pool sizes minimizing exposed transfer time (LP over the curves' convex
    hulls): variables pool_l and exposed_l; exposed_l >= per_miss * misses_l(pool_l) - window."""
    num = len(curves)
    budget = dep.pool_entries_budget(batch, context)
    if budget < num * dep.topk:
        return None
    per_miss, window = _overlap(dep, cost, batch, context)
    rows, rhs = [], []
    for layer, curve in enumerate(curves):
        for slope, intercept in hull_pieces(curve):
            row = np.zeros(2 * num)
            row[layer], row[num + layer] = per_miss * slope, -1.0
            rows.append(row)
            rhs.append(window - per_miss * intercept)
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
        pools = solve_pools(dep, cost, curves, batch, context)
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

