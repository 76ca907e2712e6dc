"""INFERCEPT's waste formulas and min-waste choice, against hand-computed values."""

import pytest

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import PolicyContext, min_waste_strategies
from flexlamps.sched.predictors import OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment, Strategy
from flexlamps.sched.waste import memory_over_time, waste_discard, waste_preserve, waste_swap, wastes


def toy_cost(swap_bytes_per_s=1000.0):
    # T_fwd(C) = 0.001 C;  T_swap(C) = C * 10 / swap_bytes_per_s;  M = 10 bytes/token
    return CostModel(overhead_s=0.0, weights_read_s=0.0, prefill_per_token_s=0.001,
                     decode_per_seq_s=0.001, kv_read_per_token_s=0.0,
                     swap_bytes_per_s=swap_bytes_per_s, kv_bytes_per_token=10,
                     gpu_kv_tokens=10_000, cpu_swap_tokens=10_000)


def test_waste_formulas_hand_computed():
    # C_i = 100, C_other = 400, T_INT = 2 s, M = 10
    assert waste_preserve(100, 2.0, 10) == pytest.approx(2 * 100 * 10)  # 2000
    assert waste_discard(100, 400, 0.1, 10) == pytest.approx(0.1 * 100 * 10 + 0.1 * 400 * 10)  # 500
    assert waste_swap(100, 400, 1.0, 10) == pytest.approx(2 * 1.0 * 500 * 10)  # 10000
    w = wastes(100, 400, 2.0, toy_cost())
    assert w[Strategy.PRESERVE] == pytest.approx(2000)
    assert w[Strategy.DISCARD] == pytest.approx(500)  # T_fwd(100) = 0.1 s
    assert w[Strategy.SWAP] == pytest.approx(10000)  # T_swap(100) = 1 s


def _paused(rid, computed, api_time):
    spec = RequestSpec(rid, computed, (Segment(1, "x", api_time, 1), Segment(1)))
    req = Request(rid, 0.0, computed)
    req.num_computed, req.api_type = computed, "x"
    return spec, req


def _ctx(specs, cost, budget, cpu_free, batch):
    return PolicyContext(now=0.0, iteration=1, cost=cost, predictor=OraclePredictor(specs),
                         batch_context_tokens=batch, swap_budget_tokens=budget,
                         cpu_free_tokens=cpu_free, step_s=0.01)


def test_min_waste_picks_cheaper_of_preserve_and_discard():
    cost = toy_cost()
    s1, long_call = _paused("long", 100, 2.0)  # preserve 2000 > discard 500
    s2, short_call = _paused("short", 100, 0.01)  # preserve 10 < discard 500
    specs = {"long": s1, "short": s2}
    got = min_waste_strategies([long_call, short_call], _ctx(specs, cost, 0, 0, 500))
    assert got == {"long": Strategy.DISCARD, "short": Strategy.PRESERVE}


def test_swap_budget_goes_to_the_most_wasteful_request():
    cost = toy_cost(swap_bytes_per_s=1e6)  # T_swap(100) = 1 ms: a hidden swap is nearly free
    s1, big = _paused("big", 100, 5.0)
    s2, small = _paused("small", 100, 0.1)
    specs = {"big": s1, "small": s2}
    # otherwise-waste: big min(preserve 5000, discard 0.1 * (100 + 100) * 10 = 200) = 200,
    # small min(preserve 100, discard 200) = 100. Room for one swap: big gets it, small preserves
    got = min_waste_strategies([small, big], _ctx(specs, cost, 150, 100, 200))
    assert got == {"big": Strategy.SWAP, "small": Strategy.PRESERVE}
    # no cpu room at all: nothing is swapped
    got = min_waste_strategies([small, big], _ctx(specs, cost, 150, 0, 200))
    assert Strategy.SWAP not in got.values()


def test_memory_over_time_hand_computed():
    cost = toy_cost()
    # decode 10 tokens from a 100-token context at 0.5 s/step: (100*10 + 10^2/2) * 0.5 = 525
    assert memory_over_time(100, 10, None, None, 0.5, cost) == pytest.approx(525)
    # + preserve a 110-token cache through a 2 s call: 220
    assert memory_over_time(100, 10, 2.0, Strategy.PRESERVE, 0.5, cost) == pytest.approx(745)
    # + discard: rebuild 110 tokens, T_fwd = 0.11 s -> 12.1
    assert memory_over_time(100, 10, 2.0, Strategy.DISCARD, 0.5, cost) == pytest.approx(537.1)
    # + swap: out and in, T_swap(110) = 1.1 s each -> 110 * 2.2 = 242
    assert memory_over_time(100, 10, 2.0, Strategy.SWAP, 0.5, cost) == pytest.approx(767)
