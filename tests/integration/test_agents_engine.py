"""The augmented engine on a tiny model: outputs equal uninterrupted generation under every
interception strategy and policy, with the memory invariants checked every iteration."""

import time

import pytest

from flexlamps.api import LLM
from flexlamps.engine.augmented.engine import AugmentedEngine, CpuClock, StepClock
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import AgentsConfig, run_policy_on_engine
from flexlamps.sched.cost_model import CostModel
from flexlamps.workloads.tokenized import tokenize_requests
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.sched.policies import InferCept
from flexlamps.sched.request import RequestSpec, Segment, Strategy

BLOCK = 4


class Forced(InferCept):
    """INFERCEPT's order, but every intercepted request gets `strategy`."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: self.strategy for r in reqs}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama))


def _specs():
    # 8 requests, 2-3 calls each, arriving over 8 iterations; the longest grows to 58 tokens
    out = []
    for i in range(8):
        segs = (Segment(4 + i % 3, "qa", 0.03 * (1 + i % 4), 3 + i % 2),
                Segment(5, "math", 0.02 * (i % 3), 2),
                *((Segment(3, "qa", 0.05, 4),) if i % 2 else ()),
                Segment(6 - i % 2))
        out.append(RequestSpec(f"r{i}-t{i % 5}", 8 + 3 * i, segs, arrival_time=0.01 * i, kind="qa"))
    return out


@pytest.fixture(scope="module")
def workload(llm):
    cfg = llm.config
    reqs = tokenize_requests(_specs(), cfg.vocab_size, set(cfg.eos_token_ids) | {0, 1})
    expected = uninterrupted_tokens(llm.executor, reqs)
    return reqs, expected


def _config(llm, gpu_blocks=18, cpu_blocks=10):
    per_block = BLOCK * llm.config.kv_bytes_per_token(4)
    return AgentsConfig(gpu_kv_bytes=gpu_blocks * per_block, cpu_swap_bytes=cpu_blocks * per_block,
                        block_size=BLOCK, max_num_seqs=6, max_num_batched_tokens=24)


@pytest.fixture(scope="module")
def cost(llm):
    """A fixed cost model (what measure_cost gives on a CPU for this model, rounded), so each
    policy's choices, and so the schedule, do not depend on the machine's load."""
    per_token = llm.config.kv_bytes_per_token(4)
    return CostModel(overhead_s=0.02, weights_read_s=0.0, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3,
                     kv_read_per_token_s=1e-6, swap_bytes_per_s=1e9, kv_bytes_per_token=per_token,
                     gpu_kv_tokens=18 * BLOCK, cpu_swap_tokens=10 * BLOCK, max_model_len=128)


def _run(llm, workload, cost, policy, config=None):
    reqs, expected = workload
    used = []  # (gpu blocks in use, gpu blocks) after each iteration
    res = run_policy_on_engine(llm.executor, reqs, policy, config or _config(llm), cost, clock=StepClock(0.01),
                               check=True, on_iteration=lambda s: used.append((s.bm.used_gpu_blocks, s.bm.num_gpu_blocks)))
    assert len(res.records) == len(reqs)
    # the pool was under pressure (nearly full at some point) and never over
    assert max(u for u, _ in used) >= used[0][1] - 3
    assert all(u <= n for u, n in used)
    return res, expected


@pytest.mark.parametrize("strategy", list(Strategy))
def test_output_equals_uninterrupted_generation_per_strategy(llm, workload, cost, strategy):
    res, expected = _run(llm, workload, cost, Forced(strategy))
    assert res.stats.strategies[strategy.value] > 0
    if strategy is Strategy.SWAP:
        assert res.stats.swap_tokens > 0
    if strategy is Strategy.DISCARD:
        assert res.stats.recompute_tokens > 0
    assert res.tokens == expected


@pytest.mark.parametrize("policy", ["fcfs", "infercept", "lamps", "sjf"])
def test_policies_are_exact_under_memory_pressure(llm, workload, cost, policy):
    res, expected = _run(llm, workload, cost, policy, _config(llm, gpu_blocks=16, cpu_blocks=6))
    assert res.tokens == expected
    for rec in res.records:
        assert rec.arrival <= rec.first_token <= rec.finish
        assert rec.e2e >= rec.api_seconds


def test_a_lost_swap_is_caught(llm, workload, cost, monkeypatch):
    """The exactness check has teeth: if swap-in copied nothing, outputs would differ."""
    monkeypatch.setattr(PagedKVCache, "swap_in", lambda self, pairs: None)
    res, expected = _run(llm, workload, cost, Forced(Strategy.SWAP))
    assert res.tokens != expected


def test_a_request_larger_than_the_pool_is_refused(llm, workload, cost):
    reqs, _ = workload
    with pytest.raises(ValueError, match="gpu KV pool holds 32"):
        run_policy_on_engine(llm.executor, reqs, "lamps", _config(llm, gpu_blocks=8), cost, clock=StepClock())


def test_cpu_clock_skips_api_waits_and_counts_only_this_process():
    clock = CpuClock()
    t0 = clock.now()
    clock.sleep_until(t0 + 100.0)  # a 100 s call returns at once
    assert clock.now() >= t0 + 100.0
    time.sleep(0.05)  # waiting on something else costs no CPU time
    assert clock.now() - (t0 + 100.0) < 0.04


class SwapsAtCall(InferCept):
    """Calls start preserved and stay reclaimable (no waste rule), except those of `swapped`,
    swapped out at the call."""

    def __init__(self, swapped):
        self.swapped = set(swapped)

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: Strategy.SWAP if r.request_id in self.swapped else Strategy.PRESERVE for r in reqs}

    def review_paused(self, paused, ctx):
        return {}, [r for r, _ in paused]


def test_a_swap_in_and_a_swap_out_in_one_iteration_keep_the_cache(llm, cost):
    """Issue 13's wrong token, on a schedule that forces it: "a" (swapped at its call, filling the
    cpu tier) is swapped back in and, in the same iteration, "c" needs room, so "b"'s preserved
    cache is reclaimed. Were "b" swapped into the cpu blocks "a" is read from, the engine (swap-outs
    first) would hand "a" the cache of "b"."""
    specs = [RequestSpec("a", 7, (Segment(1, "x", 0.5, 1), Segment(12)), kind="qa"),
             RequestSpec("b", 7, (Segment(1, "x", 4.0, 1), Segment(4)), kind="qa"),
             RequestSpec("c", 9, (Segment(1),), arrival_time=0.75, kind="qa")]
    cfg = llm.config
    reqs = tokenize_requests(specs, cfg.vocab_size, set(cfg.eos_token_ids) | {0, 1})
    outputs = []  # every output the engine ran
    original = AugmentedEngine._apply_moves

    def recording(self, out):
        outputs.append(out)
        original(self, out)

    per_block = BLOCK * cfg.kv_bytes_per_token(4)
    config = AgentsConfig(gpu_kv_bytes=6 * per_block, cpu_swap_bytes=2 * per_block, block_size=BLOCK,
                          max_num_seqs=6, max_num_batched_tokens=24)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AugmentedEngine, "_apply_moves", recording)
        res = run_policy_on_engine(llm.executor, reqs, SwapsAtCall({"a"}), config, cost, clock=StepClock(0.25), check=True)
    back = next(out for out in outputs if out.swap_in)  # the iteration "a" comes back in
    assert "c" in back.prefill and "a" in back.prefill and back.iteration == 3
    assert {c for c, _ in back.swap_in}.isdisjoint(c for _, c in back.swap_out)
    assert res.tokens == uninterrupted_tokens(llm.executor, reqs)
