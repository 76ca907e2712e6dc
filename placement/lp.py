"""The linear program over placement fractions for one discrete choice (scipy HiGHS).

Variables (in this order; the first nine are `affine.NUM_FRACTIONS`):

    symbol         meaning
    w_g w_c w_d    fraction of weight bytes on GPU / CPU / disk
    c_g c_c c_d    fraction of the KV cache on GPU / CPU / disk
    h_g h_c h_d    fraction of the activations (hidden states) on GPU / CPU / disk
    t_pre          epigraph of the per-layer prefill time (s)
    t_dec          epigraph of the per-layer decode time (s)
    m              (ESS's latent pools only) mean misses per layer, a fraction of the top-k per
                   sequence per step; m >= each piece of the layers' miss envelope at c_g, and
                   its copies join the decode terms (`choice.LatentTerms`)
    s              (MoE models only) GiB of a layer's always-read tensors off the gpu tier,
                   s >= D - w_g L and s >= 0; the gpu rows stage 2 s (`placement.staging`)

minimize   L * t_pre + L * (n - 1) * t_dec
subject to t_pre >= ctog_p + dtoc_p,  t_pre >= gtoc_p + ctod_p,  t_pre >= comp_p
           t_dec >= ctog_g + y   for y in (gtoc_g, dtoc_g, ctod_g, comp_g, routed_g)
           peak bytes of every memory row <= its tier's budget
           each triple sums to 1, every fraction in its bounds (default [0, 1])

The max() terms of the cost model become the epigraph rows above, which is exact because
the objective pushes t_pre and t_dec down onto the largest term.
"""

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from placement.affine import C_DISK, C_GPU, NUM_FRACTIONS, Affine
from placement.choice import CostTerms
from placement.staging import LAYER_ROWS

GiB = float(1 << 30)  # memory rows are solved in GiB to keep the LP well scaled
T_PRE, T_DEC = NUM_FRACTIONS, NUM_FRACTIONS + 1
NUM_VARS = NUM_FRACTIONS + 2
FULL_BOUNDS = ((0.0, 1.0),) * NUM_FRACTIONS
_PREFILL_MAX = (("ctog", "dtoc"), ("gtoc", "ctod"), ("comp",))
_DECODE_MAX = (("ctog", "gtoc"), ("ctog", "dtoc"), ("ctog", "ctod"), ("ctog", "comp"), ("ctog", "routed"))


@dataclass(frozen=True, slots=True)
class LpSolution:
    fractions: np.ndarray  # the nine fractions
    total_s: float  # predicted time of one block


def _sum(terms: dict[str, Affine], names: tuple[str, ...]) -> Affine:
    out = Affine()
    for name in names:
        out.plus(terms[name])
    return out


def _num_vars(terms: CostTerms) -> int:
    return NUM_VARS + (terms.latent is not None) + (terms.staging is not None)


def _time_rows(terms: CostTerms) -> tuple[np.ndarray, np.ndarray]:
    """Rows `coef . x - t <= -const` for every term inside the two max()es."""
    rows, rhs = [], []
    per_miss = terms.latent.decode_s_per_miss if terms.latent is not None else {}
    for table, groups, epigraph in ((terms.prefill, _PREFILL_MAX, T_PRE),
                                    (terms.decode, _DECODE_MAX, T_DEC)):
        for names in groups:
            expr = _sum(table, names)
            row = np.zeros(_num_vars(terms))
            row[:NUM_FRACTIONS] = expr.coef
            row[epigraph] = -1.0
            if epigraph == T_DEC and per_miss:
                row[NUM_VARS] = sum(per_miss.get(name, 0.0) for name in names)
            rows.append(row)
            rhs.append(-expr.const)
    return np.array(rows), np.array(rhs)


def _miss_rows(terms: CostTerms) -> tuple[np.ndarray, np.ndarray]:
    """m >= slope * c_g + intercept for each piece of the miss envelope (none without pools)."""
    num_vars = _num_vars(terms)
    if terms.latent is None:
        return np.zeros((0, num_vars)), np.zeros(0)
    pieces = terms.latent.envelope.pieces()
    rows = np.zeros((len(pieces), num_vars))
    for idx, (slope, _) in enumerate(pieces):
        rows[idx, C_GPU], rows[idx, NUM_VARS] = slope, -1.0
    return rows, -np.array([intercept for _, intercept in pieces])


def _memory_rows(terms: CostTerms, budgets: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Every memory row within its budget, a MoE layer's staging as `terms.staging`'s branch bounds
    it (the staged always-read tensors 2 s, the last variable), then the row s >= D - w_g L."""
    rows, rhs = [], []
    staging, num_vars = terms.staging, _num_vars(terms)
    for name, expr in terms.memory.items():
        row = np.zeros(num_vars)
        if staging is not None:
            expr = Affine(expr.const, expr.coef.copy()).plus(staging.bound(name))
            row[-1] = 2.0 if name in LAYER_ROWS else 0.0
        row[:NUM_FRACTIONS] = expr.coef / GiB
        rows.append(row)
        rhs.append((budgets[name] - expr.const) / GiB)
    if staging is not None:
        hinge = staging.hinge()
        row = np.zeros(num_vars)
        row[:NUM_FRACTIONS], row[-1] = hinge.coef / GiB, -1.0
        rows.append(row)
        rhs.append(-hinge.const / GiB)
    return np.array(rows), np.array(rhs)


def _sum_to_one_rows(num_vars: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.zeros((3, num_vars))
    for group in range(3):
        rows[group, 3 * group:3 * group + 3] = 1.0
    return rows, np.ones(3)


def solve_fractions(terms: CostTerms, budgets: dict[str, float],
                    bounds=FULL_BOUNDS) -> LpSolution | None:
    """Fastest fractions for one choice, or None when no fractions fit the budgets.

    Args:
        terms: the cost model's affine terms for the choice.
        budgets: bytes allowed for each memory row (keys of `terms.memory`).
        bounds: (low, high) per fraction, e.g. to pin activations off the disk.
    """
    time_a, time_b = _time_rows(terms)
    miss_a, miss_b = _miss_rows(terms)
    mem_a, mem_b = _memory_rows(terms, budgets)
    num_vars = _num_vars(terms)
    bounds = _with_cache_bounds(bounds, terms)
    if any(low > high + 1e-12 for low, high in bounds):
        return None
    eq_a, eq_b = _sum_to_one_rows(num_vars)
    objective = np.zeros(num_vars)
    objective[T_PRE] = terms.num_layers
    objective[T_DEC] = terms.num_layers * terms.num_decode_steps
    result = linprog(objective, A_ub=np.vstack([time_a, miss_a, mem_a]),
                     b_ub=np.concatenate([time_b, miss_b, mem_b]), A_eq=eq_a, b_eq=eq_b,
                     bounds=bounds + [(0, None)] * (num_vars - NUM_FRACTIONS),
                     method="highs")
    if result.status != 0:
        return None
    return LpSolution(fractions=np.clip(result.x[:NUM_FRACTIONS], 0.0, 1.0), total_s=result.fun)


def _with_cache_bounds(bounds, terms: CostTerms) -> list[tuple[float, float]]:
    """`bounds` narrowed to the c_g the engine can run (`CostTerms.cache_gpu_bounds`); with
    latent pools nothing of the cache is on disk (it all sits on the cpu tier)."""
    out = [tuple(b) for b in bounds]
    low, high = terms.cache_gpu_bounds
    out[C_GPU] = (max(out[C_GPU][0], low), min(out[C_GPU][1], high))
    if terms.latent is not None:
        out[C_DISK] = (0.0, 0.0)
    return out


def memory_excess(terms: CostTerms, budgets: dict[str, float],
                  bounds=FULL_BOUNDS) -> dict[str, float]:
    """Bytes each memory row overshoots its budget at the fractions that overshoot least.

    An elastic LP: one excess variable per row, minimize their sum. All zero means feasible.
    """
    names = list(terms.memory)
    mem_a, mem_b = _memory_rows(terms, budgets)  # a row per name, then a MoE model's staging row
    aux = [_num_vars(terms) - 1] if terms.staging is not None else []  # its s
    base = mem_a[:, list(range(NUM_FRACTIONS)) + aux]
    num_vars = base.shape[1] + len(names)
    a_ub = np.hstack([base, -np.eye(len(mem_b), len(names))])
    eq_a, eq_b = _sum_to_one_rows(num_vars)
    objective = np.concatenate([np.zeros(base.shape[1]), np.ones(len(names))])
    result = linprog(objective, A_ub=a_ub, b_ub=mem_b, A_eq=eq_a, b_eq=eq_b,
                     bounds=list(bounds) + [(0, None)] * (len(aux) + len(names)), method="highs")
    if result.status != 0:  # cannot happen: the excess variables make it always feasible
        raise RuntimeError(f"elastic memory LP failed: {result.message}")
    return {name: excess * GiB for name, excess in zip(names, result.x[base.shape[1]:])}


def affine_minima(consts: np.ndarray, coefs: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Exact minima of k affine forms over the three sum-to-one triples, 0 <= x <= highs.

    Each triple's unit of mass goes to its cheapest coordinates first, up to their highs.
    Returns +inf for a form when some triple's highs cannot add up to 1.

    Args:
        consts: (k,) constants; coefs: (k, 9) coefficients; highs: (9,) or (k, 9) bounds.
    """
    coefs = coefs.reshape(-1, 3, 3)  # (k, triple, coordinate)
    order = np.argsort(coefs, axis=2)
    sorted_coefs = np.take_along_axis(coefs, order, axis=2)
    highs = np.broadcast_to(np.asarray(highs, dtype=float).reshape(-1, 3, 3), coefs.shape)
    sorted_highs = np.take_along_axis(highs, order, axis=2)
    room_before = 1.0 - np.concatenate(
        [np.zeros(coefs.shape[:2] + (1,)), np.cumsum(sorted_highs, axis=2)[:, :, :2]], axis=2)
    take = np.clip(np.minimum(sorted_highs, room_before), 0.0, None)
    values = consts + (take * sorted_coefs).sum(axis=(1, 2))
    short = take.sum(axis=2).min(axis=1) < 1.0 - 1e-9
    return np.where(short, np.inf, values)


def _stack(exprs: list[Affine]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([e.const for e in exprs]), np.array([e.coef for e in exprs])


def _lower_rows(terms: CostTerms) -> list[tuple[str, Affine]]:
    """(row, affine lower bound of it) for every memory row of `terms`' LP: a MoE model's rows with
    their branch's bounds, each layer row twice, its 2 s at least 0 and at least 2 (D - w_g L)."""
    if terms.staging is None:
        return list(terms.memory.items())
    out = []
    for name, expr in terms.memory.items():
        row = Affine(expr.const, expr.coef.copy()).plus(terms.staging.bound(name))
        out.append((name, row))
        if name in LAYER_ROWS:
            out.append((name, Affine(row.const, row.coef.copy()).plus(terms.staging.hinge().scaled(2.0))))
    return out


def memory_implied_highs(terms: list[CostTerms], budgets: dict[str, float],
                         caps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each choice: can it fit at all, and upper bounds on single fractions it implies.

    With x_j = t and everything else at its cheapest, a memory row is at least
    minimum + t * (coef_j - cheapest coef in j's triple), which must fit the budget.

    Args:
        caps: (n, 9) upper bounds each choice's fractions already have (None: all 1).

    Returns:
        fits: (n,) False where some row exceeds its budget whatever the fractions.
        highs: (n, 9) upper bounds on the fractions (within `caps`).
    """
    caps = np.ones((len(terms), NUM_FRACTIONS)) if caps is None else np.asarray(caps, dtype=float)
    names = [name for name, _ in _lower_rows(terms[0])]
    consts, coefs = _stack([row for t in terms for _, row in _lower_rows(t)])
    minima = affine_minima(consts, coefs, np.repeat(caps, len(names), axis=0))
    minima = minima.reshape(len(terms), len(names))
    slack = np.array([budgets[name] for name in names]) - minima  # (n, rows)
    coefs = coefs.reshape(len(terms), len(names), 3, 3)
    extra = (coefs - coefs.min(axis=3, keepdims=True)).reshape(len(terms), len(names), -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        limits = np.where(extra > 0, np.maximum(slack, 0.0)[:, :, None] / extra, np.inf)
    return (slack >= 0).all(axis=1), np.minimum(limits.min(axis=1), caps)


def time_lower_bounds(terms: list[CostTerms], highs: np.ndarray) -> np.ndarray:
    """Cheap lower bounds on each choice's LP optimum: every max() term at its own best
    fractions within `highs` ((n, 9)); +inf where the highs leave nothing feasible."""
    groups = [(table, names) for table, groups in (("prefill", _PREFILL_MAX),
                                                   ("decode", _DECODE_MAX)) for names in groups]
    consts, coefs = _stack([_sum(getattr(t, table), names) for t in terms
                            for table, names in groups])
    per_term = affine_minima(consts, coefs, np.repeat(highs, len(groups), axis=0))
    per_term = per_term.reshape(len(terms), len(groups))
    pre = per_term[:, :len(_PREFILL_MAX)].max(axis=1)
    dec = per_term[:, len(_PREFILL_MAX):].max(axis=1)
    layers = np.array([t.num_layers for t in terms])
    steps = np.array([t.num_decode_steps for t in terms])
    with np.errstate(invalid="ignore"):  # 0 decode steps x inf
        bound = layers * (pre + np.where(steps > 0, steps * dec, 0.0))
    return np.where(np.isfinite(pre) & np.isfinite(dec), bound, np.inf)
