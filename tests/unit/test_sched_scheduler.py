"""Scheduler behaviour: memory accounting per strategy, vLLM's re-queue, invariants every
iteration under every policy, the starvation guard."""

import pytest

from flexlamps.sched.output import RunnerOutput
from flexlamps.sched.policies import POLICIES, InferCept, LAMPS, SchedulingPolicy, make_policy
from flexlamps.sched.predictors import OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment, Status, Strategy
from flexlamps.sched.scheduler import Scheduler
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.scheduler import SchedulerConfig
from flexlamps.sim.simulator import Simulator
from flexlamps.sim.synthetic import synthetic_specs


def small_cost():
    return CostModel.gptj6b_a100()


def tight_config(gpu_blocks=64, cpu_blocks=16, block_size=8, max_tokens=256, max_seqs=16):
    return SchedulerConfig(num_gpu_blocks=gpu_blocks, num_cpu_blocks=cpu_blocks, block_size=block_size,
                           max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens)


class Forced(SchedulingPolicy):
    """Applies a fixed strategy to every interception."""

    def __init__(self, strategy):
        self.strategy = strategy

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: self.strategy for r in reqs}


def _one_request_to_call(strategy):
    spec = RequestSpec("a", 20, (Segment(3, "calc", 1.0, 5), Segment(2)))
    sched = Scheduler(tight_config(gpu_blocks=16, cpu_blocks=8, block_size=4), Forced(strategy),
                      OraclePredictor({"a": spec}), small_cost())
    sched.add_request(Request("a", 0.0, 20))
    now = 0.0
    for step in range(3):  # prefill (samples 1), then 2 decodes -> 3 tokens: the call
        out = sched.schedule(now)
        now += 0.01
        done = step == 2
        sched.update_from_output(out, RunnerOutput(intercepted={"a": "calc"} if done else {}), now)
        sched.check_invariants()
    return sched, now


@pytest.mark.parametrize("strategy", list(Strategy))
def test_cache_location_during_and_after_a_call(strategy):
    sched, now = _one_request_to_call(strategy)
    req = sched.paused["a"]
    bm = sched.bm
    assert req.num_tokens == 23 and req.segment_output == 3
    if strategy is Strategy.PRESERVE:  # counts toward gpu
        assert bm.num_gpu_blocks_of("a") == 6 and bm.used_cpu_blocks == 0  # 22 cached tokens / 4
    elif strategy is Strategy.SWAP:  # counts toward cpu, and the copy is planned
        assert bm.used_gpu_blocks == 0 and bm.num_cpu_blocks_of("a") == 6
        out = sched.schedule(now)
        assert len(out.swap_out) == 6 and out.swapped_out == ["a"]
    else:  # toward neither
        assert bm.used_gpu_blocks == 0 and bm.used_cpu_blocks == 0 and req.num_computed == 0
    sched.resume("a", 5, now + 1.0)
    out = sched.schedule(now + 1.0)
    sched.check_invariants()
    expect_compute = 6 if strategy is not Strategy.DISCARD else 28  # last token + 5 returned
    assert out.scheduled_tokens("a") == expect_compute
    assert ("a" in out.recompute) == (strategy is Strategy.DISCARD)
    assert bool(out.swap_in) == (strategy is Strategy.SWAP)
    assert out.sampling == ["a"]


def test_fcfs_requeues_a_continuation_at_the_tail():
    specs = {s.request_id: s for s in [RequestSpec("old", 8, (Segment(1, "x", 1.0, 1), Segment(1))),
                                      RequestSpec("new", 8, (Segment(1),))]}
    sched = Scheduler(tight_config(), make_policy("fcfs"), OraclePredictor(specs), small_cost())
    sched.add_request(Request("old", 0.0, 8))
    out = sched.schedule(0.0)
    sched.update_from_output(out, RunnerOutput(intercepted={"old": "x"}), 0.1)
    assert sched.paused["old"].strategy is Strategy.DISCARD
    sched.add_request(Request("new", 0.5, 8))
    sched.resume("old", 1, 1.1)  # returns after "new" arrived: it queues behind it
    ctx = sched.context(1.1)
    pol = sched.policy
    assert pol.priority(sched.requests["new"], ctx) < pol.priority(sched.requests["old"], ctx)
    # INFERCEPT keeps the original arrival order instead
    assert InferCept().priority(sched.requests["old"], ctx) < InferCept().priority(sched.requests["new"], ctx)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_invariants_hold_every_iteration(policy):
    specs = synthetic_specs(n=80, qps=8.0, seed=3)
    seen = {"iterations": 0, "max_gpu": 0, "max_cpu": 0}

    def check(sched):
        sched.check_invariants()
        seen["iterations"] += 1
        seen["max_gpu"] = max(seen["max_gpu"], sched.bm.used_gpu_blocks)
        seen["max_cpu"] = max(seen["max_cpu"], sched.bm.used_cpu_blocks)

    sim = Simulator(specs, make_policy(policy), OraclePredictor({s.request_id: s for s in specs}),
                    small_cost(), tight_config(), on_iteration=check)
    records = sim.run()
    assert len(records) == len(specs)  # everyone finishes
    by_id = {s.request_id: s for s in specs}
    for r in records:
        assert r.output_tokens == by_id[r.request_id].output_tokens
        assert r.arrival <= r.first_token <= r.finish
    assert seen["max_gpu"] > 0.8 * 64  # the workload did press on memory
    assert seen["iterations"] > 50


def _starvation_run(policy, check):
    specs = synthetic_specs(n=120, qps=20.0, seed=5)
    sim = Simulator(specs, policy, OraclePredictor({s.request_id: s for s in specs}), small_cost(),
                    tight_config(gpu_blocks=48), on_iteration=check)
    assert len(sim.run()) == len(specs)


def test_starvation_guard_counts_iterations_waiting():
    # LAMPS's counter (mars-codebase sequence.py): +1 every iteration a request waits; at the
    # threshold it goes to the head of the queue until its next call
    threshold = 5
    seen = {"max_wait": 0, "promoted": 0}

    def check(sched):
        sched.check_invariants()  # no unpromoted request past the threshold
        for r in sched.waiting_requests():
            if r.status is Status.WAITING and not r.promoted:
                seen["max_wait"] = max(seen["max_wait"], sched.iteration - r.starve_since)
            seen["promoted"] += r.promoted

    _starvation_run(LAMPS(starvation_threshold=threshold), check)
    assert seen["max_wait"] >= threshold and seen["promoted"] > 0  # bound: check_invariants


def test_starvation_guard_bounds_pass_overs():
    threshold = 5
    seen = {"max_passed": 0, "promoted": 0}

    def check(sched):
        sched.check_invariants()  # asserts passed_over <= threshold
        for r in sched.waiting_requests():
            seen["max_passed"] = max(seen["max_passed"], r.passed_over)
            seen["promoted"] += r.promoted

    _starvation_run(LAMPS(starvation_threshold=threshold, starvation_counter="pass_over"), check)
    assert seen["max_passed"] == threshold and seen["promoted"] > 0


def test_request_larger_than_gpu_is_refused_with_a_fix():
    sched = Scheduler(tight_config(gpu_blocks=4, block_size=4), InferCept(), OraclePredictor({}), small_cost())
    with pytest.raises(ValueError, match="gpu tier"):
        sched.add_request(Request("huge", 0.0, 100))
    sched.add_request(Request("ok", 0.0, 8))
    with pytest.raises(ValueError, match="unique"):
        sched.add_request(Request("ok", 0.0, 8))


def test_unknown_policy_lists_choices():
    with pytest.raises(ValueError, match="lamps"):
        make_policy("nope")


def test_mlfq_swaps_out_a_demoted_request_for_a_new_one():
    specs = {"a": RequestSpec("a", 40, (Segment(50),)), "b": RequestSpec("b", 30, (Segment(5),))}
    sched = Scheduler(tight_config(gpu_blocks=16, cpu_blocks=16, block_size=4), make_policy("mlfq"),
                      OraclePredictor(specs), small_cost())
    sched.add_request(Request("a", 0.0, 40))
    out = sched.schedule(0.0)
    sched.update_from_output(out, RunnerOutput(), 0.1)
    sched.requests["a"].mlfq_level = 3  # as if it had used up three quanta
    sched.add_request(Request("b", 0.2, 30))
    out = sched.schedule(0.2)
    sched.check_invariants()
    assert out.preempted == ["a"] and len(out.swap_out) == 10  # 40 cached tokens / 4
    assert sched.requests["a"].status is Status.SWAPPED and "b" in out.prefill
    # InferCept never preempts for a newcomer: b simply waits
    sched2 = Scheduler(tight_config(gpu_blocks=16, cpu_blocks=16, block_size=4), InferCept(),
                       OraclePredictor(specs), small_cost())
    sched2.add_request(Request("a", 0.0, 40))
    sched2.update_from_output(sched2.schedule(0.0), RunnerOutput(), 0.1)
    sched2.add_request(Request("b", 0.2, 30))
    out2 = sched2.schedule(0.2)
    assert not out2.preempted and "b" not in out2.prefill


def test_infercept_preserves_at_the_call_then_applies_its_rule_next_iteration():
    # INFERCEPT's code: calls start preserved; at the next iteration every candidate (discard
    # waste < preserve waste) but the most wasteful is discarded; that one stays preserved
    # and is swapped out only when memory runs short
    specs = {"a": RequestSpec("a", 1000, (Segment(1, "chatbot", 30.0, 4), Segment(2))),
             "b": RequestSpec("b", 500, (Segment(1, "chatbot", 30.0, 4), Segment(2))),
             "c": RequestSpec("c", 300, (Segment(200),))}
    cfg = SchedulerConfig(num_gpu_blocks=120, num_cpu_blocks=200, block_size=16,
                          max_num_batched_tokens=2048)
    sched = Scheduler(cfg, make_policy("infercept"), OraclePredictor(specs), CostModel.infercept_gptj6b())
    for rid, spec in specs.items():
        sched.add_request(Request(rid, 0.0, spec.prompt_tokens))
    out = sched.schedule(0.0)  # all three prefill and sample their first token
    sched.update_from_output(out, RunnerOutput(intercepted={"a": "chatbot", "b": "chatbot"}), 0.1)
    assert {r: sched.paused[r].strategy for r in "ab"} == {"a": Strategy.PRESERVE, "b": Strategy.PRESERVE}
    out = sched.schedule(0.1)
    sched.check_invariants()
    assert out.discarded == ["b"] and sched.paused["b"].strategy is Strategy.DISCARD
    assert sched.paused["a"].strategy is Strategy.PRESERVE and sched._reclaimable == [sched.paused["a"]]
    # c keeps decoding until the gpu runs short (120 blocks: a holds 63, c grows past 57):
    # a's cache is swapped out, not dropped
    now = 0.1
    while sched.paused["a"].strategy is Strategy.PRESERVE:
        sched.update_from_output(out, RunnerOutput(), now)
        now += 0.01
        out = sched.schedule(now)
        sched.check_invariants()
    assert sched.paused["a"].strategy is Strategy.SWAP and "a" in out.swapped_out
    assert sched.bm.num_cpu_blocks_of("a") == 63


def test_recomputation_is_not_counted_as_service():
    # MLFQ's quanta and VTC's counters charge a request for its own tokens; rebuilding a cache
    # the scheduler dropped during a call is the scheduler's cost, not the request's service
    class Recording(Forced):
        def __init__(self):
            super().__init__(Strategy.DISCARD)
            self.seen = []

        def on_computed(self, req, tokens, steps):
            self.seen.append((tokens, steps))

    spec = RequestSpec("a", 20, (Segment(3, "calc", 1.0, 5), Segment(2)))
    policy = Recording()
    sched = Scheduler(tight_config(gpu_blocks=16, cpu_blocks=8, block_size=4), policy,
                      OraclePredictor({"a": spec}), small_cost())
    sched.add_request(Request("a", 0.0, 20))
    now, out = 0.0, None
    for step in range(3):  # prefill 20, 2 decodes, then the call drops the cache
        out = sched.schedule(now)
        now += 0.01
        sched.update_from_output(out, RunnerOutput(intercepted={"a": "calc"} if step == 2 else {}), now)
    sched.resume("a", 5, now + 1.0)  # 22 cached tokens to rebuild + 5 returned + the last sampled
    out = sched.schedule(now + 1.0)
    assert out.recompute == {"a": 22} and out.prefill == {"a": 6}
    sched.update_from_output(out, RunnerOutput(), now + 1.01)
    assert policy.seen == [(20, 1), (1, 1), (1, 1), (6, 1)]  # the 22 rebuilt tokens are not there


class SwapsAtCall(SchedulingPolicy):
    """Calls start preserved and stay reclaimable (INFERCEPT's handling), except those of
    `swapped`, swapped out at the call; running victims are swapped too."""

    reviews_paused = True
    preempt_by_swap = True

    def __init__(self, swapped):
        self.swapped = set(swapped)

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: Strategy.SWAP if r.request_id in self.swapped else Strategy.PRESERVE for r in reqs}


def test_a_swap_out_never_overwrites_the_cpu_blocks_a_swap_in_of_the_same_output_reads():
    # The engine copies an output's swap-outs before its swap-ins (gpu blocks a swap-out vacates
    # may be granted to a swap-in). Here "a" (swapped at its call, holding the whole cpu tier)
    # comes back and is swapped in; then "c" needs room and "b"'s preserved cache is reclaimed:
    # it must not be swapped into the cpu blocks "a" is being read from in the same output (the
    # engine would overwrite them first and hand "a" the cache of "b": issue 13's wrong token).
    specs = {"a": RequestSpec("a", 7, (Segment(1, "x", 0.5, 1), Segment(8))),
             "b": RequestSpec("b", 7, (Segment(1, "x", 4.0, 1), Segment(4))),
             "c": RequestSpec("c", 9, (Segment(1),), arrival_time=0.75)}
    sched = Scheduler(tight_config(gpu_blocks=6, cpu_blocks=2, block_size=4, max_tokens=24),
                      SwapsAtCall({"a"}), OraclePredictor(specs), small_cost())
    sched.add_request(Request("a", 0.0, 7))
    sched.add_request(Request("b", 0.0, 7))
    out = sched.schedule(0.0)  # both prefill, sample their one token and call
    sched.update_from_output(out, RunnerOutput(intercepted={"a": "x", "b": "x"}), 0.25)
    out = sched.schedule(0.25)  # a's cache goes to the cpu tier (both of its blocks)
    assert out.swapped_out == ["a"] and sched.bm.free_cpu_blocks == 0
    sched.resume("a", 1, 0.75)
    sched.add_request(Request("c", 0.75, 9))
    out = sched.schedule(0.75)
    sched.check_invariants()
    read = {cpu for cpu, _ in out.swap_in}
    assert len(read) == 2 and "a" in out.prefill and "c" in out.prefill
    assert read.isdisjoint(cpu for _, cpu in out.swap_out)
    # with the cpu tier busy this iteration, b's cache was dropped (recomputed on its return)
    assert sched.paused["b"].strategy is Strategy.DISCARD and out.discarded == ["b"]
    sched.update_from_output(out, RunnerOutput(finished={"c"}), 1.0)
    sched.check_invariants()
    assert sched.bm.free_cpu_blocks == 2  # a's cpu blocks are free once the copies are done
