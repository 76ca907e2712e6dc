"""Ordering rules of each policy, on hand-built requests."""

import pytest

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import LAMPS, MLFQ, SJF, VTC, PolicyContext
from flexlamps.sched.predictors import OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment, Strategy


def _ctx(specs, iteration=1, step_s=0.02):
    return PolicyContext(now=0.0, iteration=iteration, cost=CostModel.gptj6b_a100(),
                         predictor=OraclePredictor({s.request_id: s for s in specs}),
                         batch_context_tokens=10_000, swap_budget_tokens=1000, cpu_free_tokens=9000,
                         step_s=step_s)


def _req(spec, arrival=0.0, client="c"):
    return Request(spec.request_id, arrival, spec.prompt_tokens, client_id=client)


def test_sjf_orders_by_predicted_tokens_before_the_next_call():
    short = RequestSpec("short", 500, (Segment(5),))
    long = RequestSpec("long", 10, (Segment(300),))
    ctx = _ctx([short, long])
    p = SJF()
    assert p.priority(_req(short, 1.0), ctx) < p.priority(_req(long, 0.0), ctx)


def test_lamps_accounts_for_memory_held_through_the_call():
    # same output; one preserves a big cache through a call, the other has no call
    with_call = RequestSpec("call", 1500, (Segment(20, "qa", 0.5, 10), Segment(5)))
    no_call = RequestSpec("plain", 1500, (Segment(20),))
    small = RequestSpec("small", 100, (Segment(20, "qa", 0.5, 10), Segment(5)))
    ctx = _ctx([with_call, no_call, small])
    p = LAMPS()
    keys = {s.request_id: p.priority(_req(s), ctx) for s in (with_call, no_call, small)}
    assert keys["small"] < keys["plain"] < keys["call"]
    # SJF cannot tell these apart: same tokens before the call
    sjf = SJF()
    assert sjf.priority(_req(with_call), ctx)[0] == sjf.priority(_req(no_call), ctx)[0]


def test_lamps_reranks_only_every_k_iterations():
    spec = RequestSpec("a", 100, (Segment(50),))
    p = LAMPS(rerank_every=5)
    req = _req(spec)
    first = p.priority(req, _ctx([spec], iteration=1))
    assert p.priority(req, _ctx([spec], iteration=2, step_s=1.0)) == first  # cached
    assert p.priority(req, _ctx([spec], iteration=5, step_s=1.0)) != first  # re-ranked
    req.promoted = True
    assert p.priority(req, _ctx([spec], iteration=6)) < first  # the starvation guard wins


def test_mlfq_skip_join_and_demotion():
    p = MLFQ(base_quantum=4, levels=4)
    long_prompt = RequestSpec("lp", 1900, (Segment(5),))
    short_prompt = RequestSpec("sp", 10, (Segment(5),))
    ctx = _ctx([long_prompt, short_prompt], step_s=0.02)
    a, b = _req(long_prompt), _req(short_prompt, arrival=5.0)
    assert p.priority(b, ctx) < p.priority(a, ctx)  # the long prefill skips the top level
    assert b.mlfq_level == 0 and a.mlfq_level > 0
    p.on_computed(b, 1, 4)  # used its level-0 quantum (4 iterations)
    assert b.mlfq_level == 1


def test_vtc_serves_the_least_served_client_and_lifts_returning_ones():
    p = VTC()
    spec = RequestSpec("x", 10, (Segment(5),))
    heavy, light = _req(spec, 0.0, "heavy"), _req(spec, 1.0, "light")
    p.on_arrival(heavy, [])
    p.on_arrival(light, [heavy])
    p.on_computed(heavy, 100, 1)  # 100 prompt tokens x 1
    p.on_computed(heavy, 1, 10)  # 10 generated tokens x 2
    assert p.counters["heavy"] == pytest.approx(120)
    ctx = _ctx([spec])
    assert p.priority(light, ctx) < p.priority(heavy, ctx)
    p.on_computed(light, 50, 1)
    newcomer = _req(spec, 2.0, "new")
    p.on_arrival(newcomer, [heavy, light])  # lifted to the least active counter, 50
    assert p.counters["new"] == pytest.approx(50)


def test_lamps_request_horizon_counts_later_segments():
    # same first segment; one request goes on for three long segments after its call
    short = RequestSpec("short", 100, (Segment(10, "calc", 0.001, 5), Segment(5)))
    long = RequestSpec("long", 100, (Segment(10, "calc", 0.001, 5), Segment(300, "calc", 0.001, 5),
                                     Segment(300, "calc", 0.001, 5), Segment(300)))
    ctx = _ctx([short, long])
    whole, segment = LAMPS(horizon="request"), LAMPS(horizon="segment")
    assert whole.priority(_req(short), ctx) < whole.priority(_req(long), ctx)
    assert segment.priority(_req(short), ctx) == pytest.approx(segment.priority(_req(long), ctx))
    with pytest.raises(ValueError, match="horizon"):
        LAMPS(horizon="nope")


def test_lamps_handles_a_call_with_the_strategy_its_rank_assumed():
    # LAMPS (mars-repository/mars-codebase, vllm/core/scheduler_v2.py `classify`): the strategy
    # is chosen before scheduling, with predicted values; the call starts preserved and the
    # per-iteration rule applies the plans of all but the most wasteful preserved request.
    # 1000 / 500 cached tokens at the call, 30 s calls, batch 10k tokens: preserve (30 s x
    # 1000 tokens) dwarfs a chunked discard
    specs = [RequestSpec("r", 990, (Segment(10, "chatbot", 30.0, 5), Segment(5))),
             RequestSpec("s", 490, (Segment(10, "chatbot", 30.0, 5), Segment(5)))]

    def ctx(budget, cpu_free):
        return PolicyContext(now=0.0, iteration=1, cost=CostModel.gptj6b_a100(),
                             predictor=OraclePredictor({s.request_id: s for s in specs}),
                             batch_context_tokens=10_000, swap_budget_tokens=budget,
                             cpu_free_tokens=cpu_free, step_s=0.02)

    reqs = [_req(s) for s in specs]
    planned, at_call = LAMPS(), LAMPS(handling="at_call")
    for req in reqs:
        planned.priority(req, ctx(500, 0))  # ranked while the cpu tier is full: no swap
        req.num_computed = req.num_tokens = req.prompt_tokens + 10
        req.api_type = "chatbot"
    assert planned.choose_strategies(reqs, ctx(500, 500)) == {"r": Strategy.PRESERVE, "s": Strategy.PRESERVE}
    act, reclaimable = planned.review_paused([(r, r.num_computed) for r in reqs], ctx(2000, 9000))
    # both planned discards; the smaller waste (s) is applied, r stays reclaimable
    assert act == {"s": Strategy.DISCARD} and reclaimable == [reqs[0]]
    # at_call: INFERCEPT's min-waste choice at the call, with the budget and cpu of that moment
    assert at_call.choose_strategies(reqs[:1], ctx(2000, 9000)) == {"r": Strategy.SWAP}
    with pytest.raises(ValueError, match="handling"):
        LAMPS(handling="sometimes")
    with pytest.raises(ValueError, match="starvation_counter"):
        LAMPS(starvation_counter="sometimes")


def test_lamps_ts_serves_a_request_waiting_past_its_slack_first():
    from flexlamps.sched.policies import LAMPSTailSafe

    big = RequestSpec("big", 1800, (Segment(200),))
    small = RequestSpec("small", 50, (Segment(5),))
    p = LAMPSTailSafe(slack=4.0, min_wait_s=0.5, rerank_every=1)
    old, new = _req(big, 0.0), _req(small, 9.0)
    old.queued_at, new.queued_at = 0.0, 9.0
    p.typical_wait = 1.0  # admitted requests waited ~1 s: the slack is 4 s

    def ctx(now):
        c = _ctx([big, small])
        c.now = now
        return c

    assert p.priority(new, ctx(3.0)) < p.priority(old, ctx(3.0))  # 3 s: memory rank, small first
    assert p.priority(old, ctx(9.5)) < p.priority(new, ctx(9.5))  # 9.5 s > 4 s: the old one first
    p.on_admit(new, 10.0)
    assert p.typical_wait == pytest.approx(0.98 + 0.02 * 1.0)
    with pytest.raises(ValueError, match="slack"):
        LAMPSTailSafe(slack=0)


def test_lamps_ts_keeps_calls_preserved_until_memory_is_short():
    from flexlamps.sched.policies import LAMPSTailSafe

    specs = [RequestSpec("long", 990, (Segment(10, "chatbot", 30.0, 5), Segment(5))),
             RequestSpec("short", 490, (Segment(10, "chatbot", 2.0, 5), Segment(5)))]
    c = _ctx(specs)
    held = []
    for s in specs:
        req = _req(s)
        req.api_type, req.api_start = "chatbot", 0.0
        held.append((req, 1000 if s.request_id == "long" else 500))
    c.now = 1.0
    p = LAMPSTailSafe()
    act, order = p.review_paused(held, c)
    # nothing is dropped while memory lasts; the cache idling longest (29 s x 1000 tokens
    # against 1 s x 500) is the first taken under pressure (the last of the order)
    assert act == {} and [r.request_id for r in order] == ["short", "long"]
    assert LAMPSTailSafe(handling="planned").review_paused(held, c)[0] != {}  # LAMPS's rule
    # taken: dropped or swapped, whichever wastes less (Eq. 4 vs Eq. 3), 1000 tokens beside a
    # 10k-token batch. Datasheet link (25 GB/s): swap 2 x 18 ms x 11k = 404 < discard
    # 78.4 us x 1000 x 11k = 862 token x s
    assert p.reclaim_strategy(1000, c) is Strategy.SWAP
    c.cpu_free_tokens = 10  # ... unless the cpu tier cannot take it
    assert p.reclaim_strategy(1000, c) is Strategy.DISCARD
    # INFERCEPT's profile (3,990 tokens/s hidden under compute): swap 2 x 0.25 s x 11k = 5513
    # > discard 46.3 us x 1000 x 11k = 509
    c.cost, c.cpu_free_tokens = CostModel.infercept_gptj6b(), 9000
    assert p.reclaim_strategy(1000, c) is Strategy.DISCARD


def test_scheduling_and_placement_policies_have_distinct_names():
    import flexlamps.sched as sched
    import placement
    from flexlamps.sched.policies import SchedulingPolicy

    assert not hasattr(sched, "Policy") and sched.SchedulingPolicy is SchedulingPolicy
    assert placement.Policy is not SchedulingPolicy and not hasattr(placement, "SchedulingPolicy")
