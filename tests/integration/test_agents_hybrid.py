"""The augmented face on hybrid models (Qwen3-Next with MoE, Qwen3.5): each request's DeltaNet state
lives in blocks of the paged pool (engine.caches.paged_state), so it is preserved, swapped to the
cpu tier and back, or discarded and recomputed from position 0 with the request's KV blocks; the
outputs equal each request's uninterrupted generation under every strategy and policy, in memory
and with the weights offloaded, with the memory invariants checked every iteration."""

import json

import pytest
import torch
from click.testing import CliRunner

from flexlamps.api import LLM
from flexlamps.cli import main
from flexlamps.engine.augmented.engine import StepClock
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import AgentsConfig, run_policy_on_engine
from flexlamps.engine.caches.paged_state import HybridPagedCache, paged_state_blocks
from flexlamps.engine.executors.step import Step
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.request import Strategy
from flexlamps.workloads.tokenized import tokenize_requests
from placement import Policy, TierSplit
from tests.conftest import SHARED_DATA
from tests.integration.test_agents_engine import Forced, _specs

BLOCK = 16
TRACE = SHARED_DATA / "augmented" / "merged_exp_uniform.json"
# Qwen3.5 (dense MLP) runs the same cache and scheduler code as Qwen3-Next: under `slow` only
KINDS = ["qwen3_next", pytest.param("qwen3_5_text", marks=pytest.mark.slow)]
GPU_ONLY = TierSplit(gpu=1, cpu=0, disk=0)
OFFLOADED = Policy(gpu_batch_size=3, num_gpu_batches=2, weights=TierSplit(gpu=0.2, cpu=0.3, disk=0.5),
                   cache=GPU_ONLY, activations=GPU_ONLY)


@pytest.fixture(scope="module", params=KINDS)
def model(request, hybrid_models):
    """(checkpoint folder, in-memory LLM, the requests, their uninterrupted generation)."""
    llm = LLM(str(hybrid_models[request.param]))
    cfg = llm.config
    reqs = tokenize_requests(_specs(), cfg.vocab_size, set(cfg.eos_token_ids) | {0, 1})
    return hybrid_models[request.param], llm, reqs, uninterrupted_tokens(llm.executor, reqs)


def _config(llm, gpu_blocks: int, cpu_blocks: int) -> AgentsConfig:
    per_block = BLOCK * llm.config.kv_bytes_per_token(4)
    return AgentsConfig(gpu_kv_bytes=gpu_blocks * per_block, cpu_swap_bytes=cpu_blocks * per_block,
                        block_size=BLOCK, max_num_seqs=6, max_num_batched_tokens=24)


def _cost(llm, gpu_blocks: int, cpu_blocks: int) -> CostModel:
    """A fixed cost model, so each policy's choices do not depend on the machine's load."""
    state = paged_state_blocks(llm.config, BLOCK, torch.float32)
    return CostModel(overhead_s=0.02, weights_read_s=0.0, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3,
                     kv_read_per_token_s=1e-6, swap_bytes_per_s=1e9, kv_bytes_per_token=llm.config.kv_bytes_per_token(4),
                     gpu_kv_tokens=(gpu_blocks - state) * BLOCK, cpu_swap_tokens=cpu_blocks * BLOCK,
                     max_model_len=128, state_tokens=state * BLOCK)


def _pools(llm, tight: bool = False) -> tuple[int, int]:
    """gpu and cpu blocks: room for two requests' states and some KV on the gpu tier (three with
    small contexts), for one swapped request (two unless `tight`) on the cpu tier."""
    state = paged_state_blocks(llm.config, BLOCK, torch.float32)
    return (2 * state + 10, state + 6) if tight else (2 * state + 12, 2 * state + 8)


def _run(llm, reqs, policy, pools=None, executor=None):
    gpu_blocks, cpu_blocks = pools or _pools(llm)
    used = []
    res = run_policy_on_engine(executor or llm.executor, reqs, policy, _config(llm, gpu_blocks, cpu_blocks),
                               _cost(llm, gpu_blocks, cpu_blocks), clock=StepClock(0.01), check=True,
                               on_iteration=lambda s: used.append(s.bm.used_gpu_blocks))
    assert len(res.records) == len(reqs) and max(used) >= gpu_blocks - 6  # the pool was under pressure
    return res


def test_a_state_takes_whole_blocks_of_the_pool(model):
    _, llm, _, _ = model
    cache = llm.executor.new_paged_cache(10, 4, BLOCK)
    assert isinstance(cache, HybridPagedCache) and cache.state_blocks == paged_state_blocks(llm.config, BLOCK,
                                                                                            torch.float32)
    assert cache.state_blocks * cache.block_bytes >= llm.config.state_bytes_per_sequence(4) > 0
    assert cache.gpu_pool_bytes == 10 * cache.block_bytes and cache.cpu_pool_bytes == 4 * cache.block_bytes


@pytest.mark.parametrize("strategy", list(Strategy))
def test_each_strategy_keeps_the_state_exact(model, strategy):
    _, llm, reqs, expected = model
    res = _run(llm, reqs, Forced(strategy))
    assert res.stats.strategies[strategy.value] > 0
    if strategy is Strategy.SWAP:
        assert res.stats.swap_tokens > 0 and res.swapped_out_bytes > 0
    if strategy is Strategy.DISCARD:
        assert res.stats.recompute_tokens > 0
    assert res.tokens == expected


@pytest.mark.parametrize("policy", ["fcfs", "infercept", "lamps"])
def test_policies_are_exact_with_states_under_memory_pressure(model, policy):
    _, llm, reqs, expected = model
    res = _run(llm, reqs, policy, _pools(llm, tight=True))
    assert res.tokens == expected


def test_a_state_not_swapped_back_is_refused(model, monkeypatch):
    """The state check has teeth: a swap-in that copies nothing leaves the request's state blocks
    with stale bytes (not the count of tokens its state has seen), and the next step is refused."""
    _, llm, reqs, _ = model
    monkeypatch.setattr(HybridPagedCache, "swap_in", lambda self, pairs: None)
    with pytest.raises(ValueError, match=r"holds the recurrent state of -?\d+ tokens; a step from position"):
        _run(llm, reqs, Forced(Strategy.SWAP))


def test_states_swap_and_recompute_exactly_with_weights_offloaded(model, tmp_path):
    folder, llm, reqs, expected = model
    off = LLM(str(folder), gpu_mem=2 << 20, cpu_mem=2 << 20, offload_dir=str(tmp_path), policy=OFFLOADED)
    try:
        for strategy in (Strategy.SWAP, Strategy.DISCARD):
            res = _run(llm, reqs, Forced(strategy), executor=off.executor)
            assert res.tokens == expected, strategy
        assert res.tier_use["gpu"].peak_bytes <= res.tier_use["gpu"].capacity_bytes
    finally:
        off.close()


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/data/augmented is not present")
@pytest.mark.parametrize("kind", KINDS)
def test_agents_verify_is_exact_on_a_hybrid_model_with_swaps_and_discards(hybrid_models, kind, tmp_path):
    """`agents --verify` in float32 under lamps, infercept and fcfs, pools small enough that states
    are swapped to the cpu tier and discarded: every output equals its uninterrupted generation."""
    out = tmp_path / "out"
    res = CliRunner().invoke(main, [
        "agents", "--model", str(hybrid_models[kind]), "--trace", str(TRACE), "--num-requests", "6", "--qps", "50",
        "--time-scale", "0.001", "--max-context", "80", "--max-prompt", "20", "--max-output", "6",
        "--max-api-tokens", "5", "--gpu-kv-mem", "144KiB", "--cpu-swap-mem", "96KiB", "--block-size", str(BLOCK),
        "--verify", "--no-plots", "--out", str(out)])
    assert res.exit_code == 0, res.output
    results = json.loads((out / "summary.json").read_text())["results"]
    assert [r["summary"]["policy"] for r in results] == ["lamps", "infercept", "fcfs"]
    assert all(r["exact"] is True for r in results), res.output
    stats = {r["summary"]["policy"]: r["stats"] for r in results}
    assert sum(s["strategies"]["swap"] for s in stats.values()) > 0
    assert sum(s["swap_tokens"] for s in stats.values()) > 0
    assert stats["fcfs"]["strategies"]["discard"] > 0 and stats["fcfs"]["recompute_tokens"] > 0


def test_paged_states_give_one_prefills_logits_through_swaps_and_recomputes(model):
    """A request's logits through the paged pool, in chunks of any size, swapped to the cpu pool
    and back into other blocks between steps, then discarded and recomputed in other chunks: each
    step's logits are those of one whole prefill in a dense cache, bit for bit."""
    _, llm, _, _ = model
    ex, n = llm.executor, 90
    ids = torch.randint(2, llm.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(3))
    dense = ex.new_cache(1, n)
    whole = ex.forward_steps(dense, [Step(ids, torch.arange(n)[None], torch.tensor([0]))])[0]
    state = paged_state_blocks(llm.config, BLOCK, torch.float32)
    width = state + -(-n // BLOCK)
    paged = ex.new_paged_cache(2 * width, width, BLOCK)
    table, at = list(range(width)), 0

    def feed(size):
        nonlocal at
        slots = paged.set_block_tables([table])
        out = ex.forward_steps(paged, [Step(ids[:, at:at + size], torch.arange(at, at + size)[None], slots)])[0]
        assert torch.equal(out, whole[:, at:at + size]), (at, size)
        at += size

    for size in (30, 1, 20):
        feed(size)
    paged.swap_out(list(zip(table, range(width))))  # to the cpu pool, back into the other gpu blocks
    table = list(range(width, 2 * width))
    paged.swap_in(list(zip(range(width), table)))
    for size in (1, 38):
        feed(size)
    paged.free_blocks(table)  # discarded: recomputed from position 0
    at = 0
    for size in (45, 45):
        feed(size)
