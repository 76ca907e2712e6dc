"""The augmented face on the offload executor: weights on cpu and disk, the KV pool and the swap
pool charged to the same tier budgets; outputs equal uninterrupted generation for every
strategy and policy, and each tier's peak stays within its budget."""

import pytest

from flexlamps.api import LLM
from flexlamps.engine.augmented.engine import StepClock
from flexlamps.engine.augmented.pools import pool_sizes, working_set
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import measure_cost, run_policy_on_engine
from flexlamps.workloads.tokenized import tokenize_requests
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.request import Strategy
from flexlamps.settings import AugmentedSettings
from placement import Policy, TierSplit
from tests.integration.test_agents_engine import BLOCK, Forced, _config, _specs

GPU_ONLY = TierSplit(gpu=1, cpu=0, disk=0)
# weights a fifth on the gpu, the rest on cpu and disk; the policy's cache split does not apply
# to the paged pools, which are on the gpu tier (blocks) and the cpu tier (swap) by design
OFFLOADED = Policy(gpu_batch_size=3, num_gpu_batches=2, weights=TierSplit(gpu=0.2, cpu=0.3, disk=0.5),
                   cache=GPU_ONLY, activations=GPU_ONLY)
LIMITS = dict(max_context=64, block_size=BLOCK, max_num_seqs=6, max_num_batched_tokens=24)
KIB = 1024


@pytest.fixture(scope="module")
def llm(tiny_llama, tmp_path_factory):
    model = LLM(str(tiny_llama), gpu_mem=512 * KIB, cpu_mem=512 * KIB,
                offload_dir=str(tmp_path_factory.mktemp("offload")), policy=OFFLOADED)
    yield model
    model.close()


@pytest.fixture(scope="module")
def workload(llm, tiny_llama):
    """The requests and their uninterrupted generation on the plain path (all in memory)."""
    cfg = llm.config
    reqs = tokenize_requests(_specs(), cfg.vocab_size, set(cfg.eos_token_ids) | {0, 1})
    return reqs, uninterrupted_tokens(LLM(str(tiny_llama)).executor, reqs)


@pytest.fixture(scope="module")
def cost(llm):
    """A fixed cost model (what measure_cost gives on a CPU for this model, rounded), so the
    policies' choices, and so each run's schedule, do not depend on the machine's load."""
    per_token = llm.config.kv_bytes_per_token(4)
    return CostModel(overhead_s=0.02, weights_read_s=0.0, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3,
                     kv_read_per_token_s=1e-6, swap_bytes_per_s=1e9, kv_bytes_per_token=per_token,
                     gpu_kv_tokens=18 * BLOCK, cpu_swap_tokens=10 * BLOCK, max_model_len=64)


def test_weights_really_are_offloaded(llm):
    tiers = {llm.executor.store.tier_of(name) for name in llm.executor.tiers}  # each weight, each table piece
    assert tiers == {"gpu", "cpu", "disk"}


def test_offloading_changes_no_uninterrupted_generation(llm, workload):
    """Each request's uninterrupted generation is the same in memory and on the offload executor."""
    reqs, expected = workload
    for r in reqs[:3]:
        assert uninterrupted_tokens(llm.executor, [r]) == {r.spec.request_id: expected[r.spec.request_id]}


@pytest.mark.parametrize("strategy", list(Strategy))
def test_each_strategy_is_exact_with_weights_offloaded(llm, workload, cost, strategy):
    reqs, expected = workload
    res = run_policy_on_engine(llm.executor, reqs, Forced(strategy), _config(llm), cost, clock=StepClock(0.01), check=True)
    assert res.stats.strategies[strategy.value] > 0
    if strategy is Strategy.SWAP:  # (other strategies may swap too: preemption under memory pressure)
        assert res.swapped_out_bytes > 0
    assert res.tokens == expected
    for tier, use in res.tier_use.items():
        assert use.peak_bytes <= use.capacity_bytes, tier
    # the pools were charged to the tiers while the run held them, and handed back after
    assert res.tier_use["gpu"].peak_bytes >= 18 * BLOCK * llm.config.kv_bytes_per_token(4)
    assert llm.executor.tier_use()["gpu"].used_bytes == res.tier_use["gpu"].used_bytes - \
        18 * BLOCK * llm.config.kv_bytes_per_token(4)


@pytest.mark.parametrize("policy", ["fcfs", "infercept", "lamps"])
def test_policies_are_exact_with_weights_offloaded(llm, workload, cost, policy):
    reqs, expected = workload
    res = run_policy_on_engine(llm.executor, reqs, policy, _config(llm, gpu_blocks=16, cpu_blocks=6), cost,
                               clock=StepClock(0.01), check=True)
    assert res.tokens == expected


def test_pools_are_what_the_budgets_leave(llm):
    sizes = pool_sizes(llm.executor, **LIMITS)
    use = llm.executor.tier_use()
    for tier, pool, ws in (("gpu", sizes.gpu_kv_bytes, sizes.gpu_working_set),
                           ("cpu", sizes.cpu_swap_bytes, sizes.cpu_working_set)):
        left = use[tier].capacity_bytes - use[tier].used_bytes
        assert pool + ws <= left < pool + 1.2 * ws + 1, tier  # nothing on the cpu tier works with activations on gpu
    # a layer computing and the next loading, each less its share resident on the gpu tier
    assert sizes.gpu_working_set > 2 * (1 - OFFLOADED.weights.gpu) * llm.executor.max_layer_bytes * 0.9
    # the working set grows with the iteration the scheduler may issue
    bigger = working_set(llm.executor, **{**LIMITS, "max_num_batched_tokens": 48})
    assert bigger["gpu"] > sizes.gpu_working_set


def test_a_run_on_the_sized_pools_stays_within_the_budgets(tiny_llama, tmp_path):
    llm = LLM(str(tiny_llama), gpu_mem=512 * KIB, cpu_mem=512 * KIB, offload_dir=str(tmp_path), policy=OFFLOADED)
    config = llm.prepare_augmented(AugmentedSettings(**LIMITS)).pools  # what the budgets leave
    assert config.block_size == BLOCK and config.max_num_seqs == 6 and config.max_num_batched_tokens == 24
    reqs = tokenize_requests(_specs(), llm.config.vocab_size, set(llm.config.eos_token_ids) | {0, 1})
    res = run_policy_on_engine(llm.executor, reqs, "lamps", config, measure_cost(llm.executor, config, 64), clock=StepClock(0.01))
    assert res.tokens == uninterrupted_tokens(LLM(str(tiny_llama)).executor, reqs)
    assert all(u.peak_bytes <= u.capacity_bytes for u in res.tier_use.values())
    llm.close()


def test_a_gpu_budget_without_room_for_one_request_is_refused(tiny_llama, tmp_path):
    llm = LLM(str(tiny_llama), gpu_mem=400 * KIB, cpu_mem=512 * KIB, offload_dir=str(tmp_path), policy=OFFLOADED)
    with pytest.raises(ValueError, match="raise --gpu-mem"):
        llm.prepare_augmented(AugmentedSettings(**LIMITS))
    llm.close()


def test_agents_command_needs_both_tier_budgets(tiny_llama, tmp_path):
    from click.testing import CliRunner

    from flexlamps.cli import main

    trace = tmp_path / "t.json"  # --trace must exist: the budgets are checked next
    trace.write_text("[]")
    res = CliRunner().invoke(main, ["agents", "--model", str(tiny_llama), "--trace", str(trace), "--gpu-mem", "1MiB",
                                    "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--cpu-mem" in res.output


def test_agents_command_runs_offloaded_within_the_budgets(tiny_llama, tmp_path):
    import json

    from click.testing import CliRunner

    from flexlamps.cli import main
    from tests.conftest import SHARED_DATA

    trace = SHARED_DATA / "augmented" / "merged_exp_uniform.json"
    if not trace.exists():
        pytest.skip("../shared/data/augmented is not present")
    policy = tmp_path / "policy.json"
    policy.write_text(OFFLOADED.to_json())
    res = CliRunner().invoke(main, [
        "agents", "--model", str(tiny_llama), "--trace", str(trace), "--schedulers", "lamps,fcfs", "--num-requests", "3",
        "--qps", "50", "--time-scale", "0.001", "--max-context", "40", "--max-prompt", "10", "--max-output", "4",
        "--max-api-tokens", "4", "--block-size", "4", "--max-num-seqs", "4", "--max-batched-tokens", "16",
        "--gpu-mem", "512KiB", "--cpu-mem", "512KiB", "--offload-dir", str(tmp_path / "off"), "--placement", str(policy),
        "--verify", "--no-plots", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "planner: gpu KV pool" in res.output and "swapped" in res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    config, cost = summary["config"], summary["cost_model"]
    assert cost["gpu_kv_tokens"] == config["gpu_kv_bytes"] // (4 * cost["kv_bytes_per_token"]) * 4
    assert summary["placement"]["weights"]["disk"] == 0.5
    for row in summary["results"]:
        assert row["exact"] is True
        for use in row["tier_use"].values():
            assert use["peak_bytes"] <= use["capacity_bytes"]
