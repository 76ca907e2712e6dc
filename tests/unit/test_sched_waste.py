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
from flexlamps.sched.policies import (InferCept, PolicyContext, classify, infercept_review,
                                     min_waste_strategies, predicted_strategy)
from flexlamps.sched.predictors import OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment, Strategy
from flexlamps.sched.waste import (
    chunk_discard_waste,
    infercept_discard_waste,
    memory_over_time,
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


# INFERCEPT's GPT-J-6B profile (exps/6B_bench.sh): an iteration of T tokens takes a*T + c
A_S, C_S, BUDGET = 0.0463e-3, 10e-3, 384
F_S = A_S * BUDGET + C_S  # 27.7792 ms, a full 384-token iteration


def test_infercept_code_discard_waste_worked_numbers():
    # scheduler_v2.py `discard_waste`, 1024-token cache (64 blocks of 16), 16 running decodes
    # holding 16384 tokens: c_h = 384 - 16 = 368, n = ceil(1024 / 368) - 1 = 2, last = 288
    own = F_S * 3 * 2 / 2 * 368  # 30.668
    stall = A_S * 368 * 2 * 16384  # 558.314
    tail = A_S * 288 * (16384 + 288)  # 222.311
    assert own + stall + tail == pytest.approx(811.2936, abs=1e-3)
    assert infercept_discard_waste(1024, 16384, 368, F_S, A_S) == pytest.approx(811.2936, abs=1e-3)
    # the same through the papers' preset and a PolicyContext (16 decodes in flight)
    ctx = _ctx({}, CostModel.infercept_gptj6b(), 0, 0, 16384, chunk=368, budget_tokens=BUDGET)
    assert ctx.discard_waste(1024) == pytest.approx(811.2936, abs=1e-3)
    # one chunk (C_i < c_h) is Eq. 1 with T_fwd priced at its slope: 0.001 * 100 * (400 + 100)
    assert infercept_discard_waste(100, 400, 2048, 99.0, 0.001) == pytest.approx(
        waste_discard(100, 400, 0.1, 1.0)) == pytest.approx(50)
    # the code's quirk, kept: an exact multiple of c_h loses its last chunk (n = 1, last = 0)
    assert infercept_discard_waste(736, 0, 368, F_S, A_S) == pytest.approx(F_S * 368)
    # in bytes x seconds through the cost model: the same times M
    cost = toy_cost(overhead_s=0.01)  # a full 2048-token iteration: 2.058 s
    assert chunk_discard_waste(100, 400, 2048, cost) == pytest.approx(50 * 10)
    w = wastes(100, 400, 2.0, toy_cost(), chunk_tokens=2048)
    assert w[Strategy.PRESERVE] == pytest.approx(2000)  # Eq. 2
    assert w[Strategy.DISCARD] == pytest.approx(500)  # Eq. 4 (one chunk: Eq. 1)
    assert w[Strategy.SWAP] == pytest.approx(10000)  # Eq. 3, T_swap(100) = 1 s


def test_infercept_per_iteration_rule_worked_numbers():
    # three caches preserved through calls, 16 decodes holding 16384 tokens running, now = 10 s
    cost = CostModel.infercept_gptj6b()
    specs, held = {}, []
    for rid, tokens, api_s, started in (("a", 1024, 6.0, 9.0), ("b", 512, 2.5, 9.5),
                                        ("c", 256, 0.2, 9.9)):
        specs[rid], req = _paused(rid, tokens, api_s)
        req.api_start = started
        held.append((req, tokens))
    ctx = _ctx(specs, cost, 0, 0, 16384, chunk=368, budget_tokens=BUDGET, now=10.0)
    # a: preserve 5 s left x 1024 = 5120 > discard 811.29 -> candidate, waste 811.29
    # b: preserve 2 s x 512 = 1024 > discard 10.22 + 279.16 + 110.20 = 399.58 -> candidate
    # c: preserve 0.1 s x 256 = 25.6 < discard 0.0463e-3 * 256 * 16640 = 197.2 -> stays
    assert ctx.discard_waste(512) == pytest.approx(399.58, abs=0.01)
    assert ctx.discard_waste(256) == pytest.approx(197.23, abs=0.01)
    act, reclaimable = infercept_review(held, ctx, lambda r, t: (
        (Strategy.DISCARD, ctx.discard_waste(t))
        if ctx.discard_waste(t) < t * (r.api_start + specs[r.request_id].segments[0].api_time - ctx.now)
        else (Strategy.PRESERVE, 0.0)))
    # every candidate below the most wasteful is discarded now; the most wasteful (a) stays
    # preserved, taken only under memory pressure
    assert act == {"b": Strategy.DISCARD} and [r.request_id for r in reclaimable] == ["a"]
    assert InferCept().review_paused(held, ctx) == (act, reclaimable)
    # alone, a candidate is its own maximum: nothing is discarded
    assert InferCept().review_paused(held[1:], ctx) == ({}, [held[1][0]])


def _paused(rid, computed, api_time):
    spec = RequestSpec(rid, computed, (Segment(1, "x", api_time, 1), Segment(1)))
    req = Request(rid, 0.0, computed)
    req.num_computed, req.api_type = computed, "x"
    return spec, req


def _ctx(specs, cost, budget, cpu_free, batch, chunk=2048, budget_tokens=2048, now=0.0):
    return PolicyContext(now=now, iteration=1, cost=cost, predictor=OraclePredictor(specs),
                         batch_context_tokens=batch, swap_budget_tokens=budget,
                         cpu_free_tokens=cpu_free, step_s=0.01, chunk_tokens=chunk,
                         budget_tokens=budget_tokens)


def test_min_waste_picks_cheaper_of_preserve_and_chunked_discard():
    cost = toy_cost()
    s1, long_call = _paused("long", 100, 2.0)  # preserve 2000 > chunked discard 500
    s2, short_call = _paused("short", 100, 0.01)  # preserve 10 < chunked discard 500
    specs = {"long": s1, "short": s2}
    # the intercepted requests have left the batch: C_other is the whole running context, 400
    got = min_waste_strategies([long_call, short_call], _ctx(specs, cost, 0, 0, 400))
    assert got == {"long": Strategy.DISCARD, "short": Strategy.PRESERVE}


def test_swap_budget_goes_to_the_most_wasteful_request():
    cost = toy_cost()
    s1, big = _paused("big", 100, 5.0)
    s2, small = _paused("small", 100, 0.1)
    specs = {"big": s1, "small": s2}
    # C_other 100: otherwise-waste (Eq. 5): big min(preserve 5000, discard 0.001*100*200*10 =
    # 200) = 200; small min(preserve 100, 200) = 100. The budget holds one 100-token cache: the
    # most wasteful (big) is swapped, small keeps the cheaper preserve
    got = min_waste_strategies([small, big], _ctx(specs, cost, 150, 100, 100))
    assert got == {"big": Strategy.SWAP, "small": Strategy.PRESERVE}
    # no cpu room: nothing is swapped, big falls back to its cheaper option, discard
    got = min_waste_strategies([small, big], _ctx(specs, cost, 150, 0, 100))
    assert got == {"big": Strategy.DISCARD, "small": Strategy.PRESERVE}


def test_no_unpipelined_swap_outside_the_budget():
    # Eq. 3 would be the cheapest here (T_swap(100) = 1 ms: 2 * 0.001 * 500 * 10 = 10), but
    # INFERCEPT only swaps inside the budget; the rest preserve or discard
    cost = toy_cost(swap_bytes_per_s=1e6)
    s1, req = _paused("r", 100, 2.0)
    got = min_waste_strategies([req], _ctx({"r": s1}, cost, 0, 10_000, 400))
    assert got == {"r": Strategy.DISCARD}


def test_lamps_classify_worked_numbers():
    # LAMPS's `classify`: the least of preserve (Eq. 2), chunked discard (Eq. 4 as INFERCEPT's
    # code prices it) and swap (Eq. 3), in token x seconds. c_i 100, C_other 400:
    ctx = _ctx({}, toy_cost(), 0, 10_000, 400)
    # 2 s call: preserve 200, discard 0.001 * 100 * 500 = 50, swap 2 * 1 s * 500 = 1000
    assert classify(100, 2.0, ctx) == (Strategy.DISCARD, pytest.approx(50))
    assert classify(100, 0.1, ctx) == (Strategy.PRESERVE, pytest.approx(10))  # 10 < 50
    # a fast link: swap 2 * 0.001 * 500 = 1 wins, unless the cpu tier cannot take the cache
    fast = _ctx({}, toy_cost(swap_bytes_per_s=1e6), 0, 10_000, 400)
    assert classify(100, 0.1, fast) == (Strategy.SWAP, pytest.approx(1))
    full = _ctx({}, toy_cost(swap_bytes_per_s=1e6), 0, 50, 400)
    assert predicted_strategy(100, 0.1, full) is Strategy.PRESERVE


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
