"""INFERCEPT's waste formulas and min-waste choice, LAMPS's memory over time, against
hand-computed values.

Sources: INFERCEPT, arXiv 2402.01869 v2, Sec. 3.2-4.3, Eqs. 1-5, and its implementation
WukLab/InferCept vllm/core/scheduler_v2.py (`discard_waste`: chunks of S - running tokens, a
chunk priced at its per-token slope); LAMPS, arXiv 2410.18248 Sec. 4, and
mars-repository/mars-codebase vllm/core/policy.py (`V2.get_priority`: memory x time, a
triangle for each swap transfer, the growing cache while recomputing).
"""

import pytest

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import PolicyContext, min_waste_strategies, predicted_strategy
from flexlamps.sched.predictors import OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment, Strategy
from flexlamps.sched.waste import (
    chunk_discard_waste,
    memory_over_time,
    recompute_chunks,
    waste_chunk_discard,
    waste_discard,
    waste_preserve,
    waste_swap,
    wastes,
)


def toy_cost(swap_bytes_per_s=1000.0, overhead_s=0.0):
    # T_fwd(C) = overhead + 0.001 C;  chunk_time(C) = 0.001 C;  T_swap(C) = 10 C / swap_bytes_per_s;
    # M = 10 bytes/token
    return CostModel(overhead_s=overhead_s, weights_read_s=0.0, prefill_per_token_s=0.001,
                     decode_per_seq_s=0.001, kv_read_per_token_s=0.0,
                     swap_bytes_per_s=swap_bytes_per_s, kv_bytes_per_token=10,
                     gpu_kv_tokens=10_000, cpu_swap_tokens=10_000)


def test_paper_equations_hand_computed():
    # C_i = 100, C_other = 400, T_INT = 2 s, M = 10
    assert waste_preserve(100, 2.0, 10) == pytest.approx(2 * 100 * 10)  # Eq. 2: 2000
    assert waste_discard(100, 400, 0.1, 10) == pytest.approx(0.1 * 100 * 10 + 0.1 * 400 * 10)  # Eq. 1: 500
    assert waste_swap(100, 400, 1.0, 10) == pytest.approx(2 * 1.0 * 500 * 10)  # Eq. 3: 10000
    # Eq. 4, n = 4 chunks of 25 tokens, T_fwd(100) = 0.1 s, T_fwd(25) = 0.025 s:
    # 0.1 * 100 * 10 / 2 + 4 * 0.025 * 400 * 10 = 50 + 400
    assert waste_chunk_discard(100, 400, 0.1, 0.025, 4, 10) == pytest.approx(450)


def test_chunked_discard_priced_with_the_cost_model():
    cost = toy_cost(overhead_s=0.01)  # T_fwd(100) = 0.11 s; a chunk has no fixed part
    assert recompute_chunks(100, 30) == 4 and recompute_chunks(100, 2048) == 1
    assert recompute_chunks(100, 0) == 100  # a full batch still moves one token per step
    # 0.11 * 100 * 10 / 2 + 4 * 0.025 * 400 * 10 = 55 + 400
    assert chunk_discard_waste(100, 400, 30, cost) == pytest.approx(455)
    # one chunk: 55 + 1 * 0.1 * 400 * 10; chunking halves the request's own term, not the rest
    assert chunk_discard_waste(100, 400, 2048, cost) == pytest.approx(455)
    assert chunk_discard_waste(100, 400, 2048, cost) < waste_discard(100, 400, 0.11, 10)  # 550
    w = wastes(100, 400, 2.0, toy_cost(), chunk_tokens=2048)
    assert w[Strategy.PRESERVE] == pytest.approx(2000)
    assert w[Strategy.DISCARD] == pytest.approx(450)  # Eq. 4: 50 + 400
    assert w[Strategy.SWAP] == pytest.approx(10000)  # Eq. 3, T_swap(100) = 1 s


def _paused(rid, computed, api_time):
    spec = RequestSpec(rid, computed, (Segment(1, "x", api_time, 1), Segment(1)))
    req = Request(rid, 0.0, computed)
    req.num_computed, req.api_type = computed, "x"
    return spec, req


def _ctx(specs, cost, budget, cpu_free, batch):
    return PolicyContext(now=0.0, iteration=1, cost=cost, predictor=OraclePredictor(specs),
                         batch_context_tokens=batch, swap_budget_tokens=budget,
                         cpu_free_tokens=cpu_free, step_s=0.01, chunk_tokens=2048)


def test_min_waste_picks_cheaper_of_preserve_and_chunked_discard():
    cost = toy_cost()
    s1, long_call = _paused("long", 100, 2.0)  # preserve 2000 > chunked discard 450
    s2, short_call = _paused("short", 100, 0.01)  # preserve 10 < chunked discard 450
    specs = {"long": s1, "short": s2}
    got = min_waste_strategies([long_call, short_call], _ctx(specs, cost, 0, 0, 500))
    assert got == {"long": Strategy.DISCARD, "short": Strategy.PRESERVE}


def test_swap_budget_goes_to_the_most_wasteful_request():
    cost = toy_cost()
    s1, big = _paused("big", 100, 5.0)
    s2, small = _paused("small", 100, 0.1)
    specs = {"big": s1, "small": s2}
    # batch 200 -> C_other 100. otherwise-waste (Eq. 5): big min(preserve 5000, chunked discard
    # 50 + 0.1 * 100 * 10 = 150) = 150; small min(preserve 100, 150) = 100. The budget holds one
    # 100-token cache: the most wasteful (big) is swapped, small keeps the cheaper preserve
    got = min_waste_strategies([small, big], _ctx(specs, cost, 150, 100, 200))
    assert got == {"big": Strategy.SWAP, "small": Strategy.PRESERVE}
    # no cpu room: nothing is swapped, big falls back to its cheaper option, discard
    got = min_waste_strategies([small, big], _ctx(specs, cost, 150, 0, 200))
    assert got == {"big": Strategy.DISCARD, "small": Strategy.PRESERVE}


def test_no_unpipelined_swap_outside_the_budget():
    # Eq. 3 would be the cheapest here (T_swap(100) = 1 ms: 2 * 0.001 * 500 * 10 = 10), but
    # INFERCEPT only swaps inside the budget; the rest preserve or discard
    cost = toy_cost(swap_bytes_per_s=1e6)
    s1, req = _paused("r", 100, 2.0)
    got = min_waste_strategies([req], _ctx({"r": s1}, cost, 0, 10_000, 500))
    assert got == {"r": Strategy.DISCARD}


def test_lamps_predicted_strategy():
    cost = toy_cost()
    ctx = _ctx({}, cost, 0, 10_000, 500)
    # c_i 100, C_other 400, 2 s call: preserve 2000, chunked discard 450, swap (Eq. 3) 10000
    assert predicted_strategy(100, 2.0, ctx) is Strategy.DISCARD
    assert predicted_strategy(100, 0.1, ctx) is Strategy.PRESERVE  # preserve 100 < 450
    # a cache that fits the swap budget is expected to move for free
    ctx = _ctx({}, cost, 100, 10_000, 500)
    assert predicted_strategy(100, 0.1, ctx) is Strategy.SWAP
    ctx = _ctx({}, cost, 100, 50, 500)  # ... but not when the cpu tier cannot take it
    assert predicted_strategy(100, 0.1, ctx) is Strategy.PRESERVE


def test_memory_over_time_hand_computed():
    cost = toy_cost(overhead_s=0.01)
    # decode 10 tokens from a 100-token context at 0.5 s/step: (100*10 + 10^2/2) * 0.5 = 525
    assert memory_over_time(100, 10, None, None, 0.5, cost) == pytest.approx(525)
    # + preserve a 110-token cache through a 2 s call: 220
    assert memory_over_time(100, 10, 2.0, Strategy.PRESERVE, 0.5, cost) == pytest.approx(745)
    # + discard: the 110-token cache regrows over T_fwd(110) = 0.12 s: 110 * 0.12 / 2 = 6.6
    assert memory_over_time(100, 10, 2.0, Strategy.DISCARD, 0.5, cost) == pytest.approx(531.6)
    # + swap: drains out and fills in, T_swap(110) = 1.1 s each way, a triangle each: 110 * 1.1
    assert memory_over_time(100, 10, 2.0, Strategy.SWAP, 0.5, cost) == pytest.approx(646)
