"""The augmented engine's KV pools (and so the scheduler's gpu / cpu capacities) come from the
tiers' budgets through the placement planner."""

import dataclasses

import pytest
from click.testing import CliRunner

from flexlamps.engine.augmented.kv_pools import kv_pools
from placement import ModelSpec, model_preset

GIB, MIB = 1 << 30, 1 << 20


def _smollm2_fp32() -> ModelSpec:
    return dataclasses.replace(model_preset("smollm2-135m"), dtype="fp32")


def _pools(gpu, cpu, **kw):
    limits = dict(max_num_seqs=16, max_context=256, max_num_batched_tokens=256) | kw
    return kv_pools(_smollm2_fp32(), gpu_mem_bytes=gpu, cpu_mem_bytes=cpu, **limits)


def test_pools_are_what_each_budget_leaves_beside_the_model():
    model = _smollm2_fp32()
    pools = _pools(1 * GIB, 1 * GIB)
    # the cpu tier holds nothing but swap space: its whole usable share (90%, the planner's)
    assert pools.cpu_swap_bytes == int(0.9 * GIB)
    # the gpu pool: the usable share minus the weights and the working set. SmolLM2-135M in fp32:
    # 30 layers of 576-wide GQA (3 kv heads of 64), 2 x 3 x 64 x 4 B = 1536 B per token per layer;
    # the plan's own cache for 16 x 256 tokens is 30 x 16 x 256 x 1536 B
    planned_cache = 30 * 16 * 256 * 1536
    assert model.cache_bytes_per_token_per_layer() == 1536
    weights = model.num_layers * model.weight_bytes_per_layer() + model.embedding_bytes()
    not_cache = pools.plan.peak_bytes["gpu"] - planned_cache
    assert pools.gpu_kv_bytes == pytest.approx(0.9 * GIB - not_cache, abs=1)
    assert weights < not_cache < weights + 8 * MIB  # weights, plus a few MiB of activations
    # every extra byte of budget goes to the pool, at the usable share
    bigger = _pools(2 * GIB, 3 * GIB)
    assert bigger.gpu_kv_bytes - pools.gpu_kv_bytes == pytest.approx(0.9 * GIB, abs=2)
    assert bigger.cpu_swap_bytes == int(0.9 * 3 * GIB)
    assert _pools(1 * GIB, 0).cpu_swap_bytes == 0  # no cpu budget: no swapping


def test_a_gpu_budget_the_weights_fill_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="raise the gpu budget"):
        _pools(512 * MIB, GIB)  # the fp32 weights alone are 513 MiB


def test_engine_scheduler_capacities_come_from_the_tier_budgets(tiny_llama):
    from flexlamps.api import LLM
    from flexlamps.engine.augmented.engine import StepClock
    from flexlamps.engine.augmented.run import AgentsConfig, measure_cost, run_policy_on_engine
    from flexlamps.engine.augmented.workload import tokenize_requests
    from flexlamps.sched.request import RequestSpec, Segment

    llm = LLM(str(tiny_llama))
    spec = dataclasses.replace(ModelSpec.from_hf_config(llm.reader.hf_config), dtype="fp32")
    weights = spec.num_layers * spec.weight_bytes_per_layer() + spec.embedding_bytes()
    gpu_mem, cpu_mem = int(weights / 0.9) + 256 * 1024, 64 * 1024
    config = AgentsConfig.from_tier_budgets(llm, gpu_mem_bytes=gpu_mem, cpu_mem_bytes=cpu_mem, max_context=64,
                                            block_size=4, max_num_seqs=4, max_num_batched_tokens=16)
    assert config.cpu_swap_bytes == int(0.9 * cpu_mem)
    assert 0 < config.gpu_kv_bytes < 256 * 1024 and config.gpu_kv_bytes + weights <= 0.9 * gpu_mem
    per_block = 4 * llm.config.kv_bytes_per_token(4)
    reqs = tokenize_requests([RequestSpec(f"r{i}-t", 6, (Segment(3, "qa", 0.01, 2), Segment(2))) for i in range(2)],
                             llm.config.vocab_size, set(llm.config.eos_token_ids))
    seen = []
    cost = measure_cost(llm, config, 64)
    run_policy_on_engine(llm, reqs, "lamps", config, cost, clock=StepClock(0.01),
                         on_iteration=lambda s: seen.append((s.bm.num_gpu_blocks, s.bm.num_cpu_blocks)))
    assert set(seen) == {(config.gpu_kv_bytes // per_block, config.cpu_swap_bytes // per_block)}
    assert cost.gpu_kv_tokens == config.gpu_kv_bytes // per_block * 4


def test_agents_command_needs_both_tier_budgets(tiny_llama, tmp_path):
    from flexlamps.cli import main

    res = CliRunner().invoke(main, ["agents", "--model", str(tiny_llama), "--trace", "t.json", "--gpu-mem", "1MiB",
                                    "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--cpu-mem" in res.output


def test_agents_command_sizes_the_pools_from_the_tier_budgets(tiny_llama, tmp_path):
    import json

    from flexlamps.cli import main
    from tests.conftest import SHARED_DATA

    trace = SHARED_DATA / "augmented" / "merged_exp_uniform.json"
    if not trace.exists():
        pytest.skip("../shared/data/augmented is not present")
    res = CliRunner().invoke(main, [
        "agents", "--model", str(tiny_llama), "--trace", str(trace), "--policies", "lamps", "--num-requests", "2",
        "--qps", "50", "--time-scale", "0.001", "--max-context", "40", "--max-prompt", "10", "--max-output", "4",
        "--max-api-tokens", "4", "--block-size", "4", "--gpu-mem", "2MiB", "--cpu-mem", "64KiB",
        "--no-plots", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "planner: gpu KV pool" in res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    config, cost = summary["config"], summary["cost_model"]
    assert config["cpu_swap_bytes"] == int(0.9 * 64 * 1024)
    assert cost["gpu_kv_tokens"] == config["gpu_kv_bytes"] // (4 * cost["kv_bytes_per_token"]) * 4
