"""Pool eviction (LRU vs the Belady bound), per-layer pool sizing, and ESS's deployment numbers."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.ess import (ESS_TABLE, EssDeployment, StepCost, plan_global, plan_global_at, plan_per_layer,
                           solve_pools)
from placement.eviction import belady_misses, lru_misses
from placement.latent_traces import MissCurve, miss_curve, synthetic_trace


def _trace(*steps):
    return [np.array(s) for s in steps]


def test_lru_and_belady_by_hand():
    # pool of 2, a cycle of 3: LRU always evicts what comes next; Belady keeps 0 and 1 at
    # step 2 (needed at steps 3 and 4) and drops 2 (never needed again)
    trace = _trace([0], [1], [2], [0], [1])
    assert lru_misses(trace, 3, 2).tolist() == [1, 1, 1, 1, 1]
    assert belady_misses(trace, 3, 2).tolist() == [1, 1, 1, 0, 0]
    # a tie in recency goes to the lower position: after {0,1} then {2}, LRU keeps 0 and 2
    assert lru_misses(_trace([0, 1], [2], [0], [1]), 3, 2).tolist() == [2, 1, 0, 1]


def test_pool_as_large_as_the_context_only_misses_first_uses():
    trace = synthetic_trace(256, 16, 12, 0.5, seed=3)
    first_uses = len(np.unique(np.concatenate(trace)))
    assert lru_misses(trace, 256, 256).sum() == first_uses == belady_misses(trace, 256, 256).sum()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(0, 11), min_size=1, max_size=4), min_size=1, max_size=12),
       st.integers(4, 12))
def test_belady_never_misses_more_than_lru(sets, capacity):
    trace = [np.array(sorted(s)) for s in sets]
    lru, opt = lru_misses(trace, 12, capacity), belady_misses(trace, 12, capacity)
    assert opt.sum() <= lru.sum()
    assert (opt >= 0).all() and all(m <= len(s) for m, s in zip(lru, sets))


def test_more_pool_never_misses_more():
    trace = synthetic_trace(2048, 64, 20, 0.9, seed=1)
    curve = miss_curve(trace, 2048, [64, 128, 256, 512, 2048])
    assert list(curve.lru) == sorted(curve.lru, reverse=True)
    assert all(b <= l for b, l in zip(curve.belady, curve.lru))


def _curves(num_layers, context, topk):
    """Layers from cold (many misses) to hot (few), convex in the pool size."""
    sizes = (topk, context // 8, context // 4, context // 2, context)
    curves = []
    for layer in range(num_layers):
        scale = 600.0 * 0.7 ** layer
        lru = tuple(scale * (topk / s) ** 1.5 for s in sizes)
        curves.append(MissCurve(sizes, lru, lru))
    return curves


def _zero_curves(num_layers, context, topk):
    return [MissCurve((topk, context), (0.0, 0.0), (0.0, 0.0)) for _ in range(num_layers)]


def test_step_cost_goes_through_ess_points():
    dep = EssDeployment()
    assert dep.baseline_batch(32768) == 52 and dep.baseline_batch(131072) == 13  # ESS's baselines
    # no misses: the lines go through ESS's four published step times
    cost = StepCost.fit_ess(dep, {c: _zero_curves(61, c, dep.topk) for c in ESS_TABLE})
    for context, row in ESS_TABLE.items():
        for batch, tps in ((row["base_batch"], row["base_tokens_per_s"]), (row["ess_batch"], row["ess_tokens_per_s"])):
            assert dep.tokens_per_s(batch, cost.seconds(batch, context)) == pytest.approx(tps, rel=1e-9)
    # the per-context-token cost is the indexer reading 61 x 132 B per token, near HBM speed
    assert 1.5e12 < 61 * 132 / cost.indexer_s_per_seq_token() < 3.35e12
    # with misses: compute plus the exposed copy still gives ESS's offloaded points
    curves = {c: [MissCurve((dep.topk, c), (1000.0, 0.0), (1000.0, 0.0))] * 61 for c in ESS_TABLE}
    cost = StepCost.fit_ess(dep, curves)
    for context, row in ESS_TABLE.items():
        plan = plan_global_at(dep, cost, curves[context], context, row["ess_batch"], row["rho"])
        assert plan.exposed_transfer_s > 0
        assert plan.tokens_per_s == pytest.approx(row["ess_tokens_per_s"], rel=1e-6)


def test_overlap_window_hides_what_it_should():
    """A layer's copy is hidden up to the attention over its hits plus half the indexer."""
    dep = EssDeployment(num_layers=1)
    cost = StepCost((32768, 131072), (0.04, 0.035), (4.8e-4, 9.6e-4))
    batch, context = 100, 32768
    indexer = batch * context * cost.indexer_s_per_seq_token()
    per_copy = batch * dep.latent_bytes / dep.h2d_bytes_per_s
    for misses in (10.0, 500.0, 2000.0):
        window = dep.attention_s_per_layer(batch) * (1 - misses / dep.topk) + 0.5 * indexer
        curve = [MissCurve((dep.topk, context), (misses, misses), (misses, misses))]
        plan = plan_global_at(dep, cost, curve, context, batch, 0.2)
        assert plan.exposed_transfer_s == pytest.approx(max(0.0, misses * per_copy - window))


def test_per_layer_pools_fit_the_budget_and_beat_one_global_fraction():
    # no overlap (an infinitely fast attention, none of the indexer), so every miss costs time
    dep = EssDeployment(num_layers=8, cache_budget_bytes=52 * 32768 * 8 * 788,
                        attention_flops_per_s=float("inf"), indexer_overlap=0.0)
    cost = StepCost((32768, 131072), (0.04, 0.035), (4.8e-4, 9.6e-4))
    curves = _curves(8, 32768, dep.topk)
    batch = 120
    pools = solve_pools(dep, cost, curves, batch, 32768)
    assert sum(pools) <= dep.pool_entries_budget(batch, 32768) * (1 + 1e-9)
    assert pools[0] > pools[-1]  # the cold layer gets the larger pool
    best_global = plan_global(dep, cost, curves, 32768)
    per_layer = plan_per_layer(dep, cost, curves, 32768)
    assert per_layer.tokens_per_s >= best_global.tokens_per_s


@pytest.mark.slow
def test_ess_table_at_deepseek_scale():
    """scripts/sim_ess.py's numbers: both gains within 15% of ESS's, batches near ESS's at its
    rho, per-layer pools at least as fast as the best global rho."""
    from placement.ess import baseline_tokens_per_s, gain
    from placement.latent_traces import ess_layer_curves

    dep = EssDeployment()
    curves = ess_layer_curves(dep.num_layers, dep.topk, list(ESS_TABLE))
    cost = StepCost.fit_ess(dep, curves)
    for context, row in ESS_TABLE.items():
        base = baseline_tokens_per_s(dep, cost, context)[1]
        at_ess = plan_global(dep, cost, curves[context], context, rho=row["rho"])
        assert abs(at_ess.batch / row["ess_batch"] - 1) < 0.1
        assert plan_per_layer(dep, cost, curves[context], context).tokens_per_s >= \
            plan_global(dep, cost, curves[context], context).tokens_per_s
        ess_gain = row["ess_tokens_per_s"] / row["base_tokens_per_s"] - 1
        assert abs(gain(at_ess, base) / ess_gain - 1) < 0.15
