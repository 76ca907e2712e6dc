"""The run plan: one pure step from RunSettings and the workload to the placement, the batch sizes,
the budgets and the augmented face's pools; the ModelSpec built once per run; executors built
from the plan; the agents command's two kinds of policy under names of their own."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import placement
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.run_plan import Workload, plan_augmented, plan_run
from flexlamps.run_plan.build import build_executor
from flexlamps.settings import AugmentedSettings, RunSettings
from placement import Policy, TierSplit

MiB = 1 << 20
SPLIT = Policy(gpu_batch_size=3, num_gpu_batches=2, weights=TierSplit(gpu=0.5, cpu=0.5, disk=0),
               cache=TierSplit(gpu=1, cpu=0, disk=0), activations=TierSplit(gpu=1, cpu=0, disk=0))


@pytest.fixture(scope="module")
def reader(tiny_llama):
    return open_checkpoint(str(tiny_llama))


def _plan(reader, workload=Workload(), **settings):
    run = RunSettings.parse(reader.path, dtype="float32", **settings)
    return plan_run(run, reader.config, model_spec(reader.config), torch.float32, workload,
                    hardware=placement.hardware_preset("t4-flexgen"), disk_bytes=1 << 30)


def test_in_memory_plans_no_placement(reader):
    plan = _plan(reader, max_batch_size=5)
    assert plan.policy is None and not plan.offloaded and plan.max_batch_size == 5 and plan.micro_batch is None


def test_a_given_policy_is_planned_as_it_is_with_the_compression_asked_for(reader):
    plan = _plan(reader, gpu_mem=4 * MiB, cpu_mem=4 * MiB, policy=SPLIT, compress_cache=True)
    assert plan.policy.weights == SPLIT.weights and plan.policy.compress_cache and not plan.policy.compress_weight
    assert (plan.max_batch_size, plan.micro_batch) == (6, 3) and plan.predicted is None


def test_the_model_spec_is_built_once_a_run_for_profile_planner_dry_runs_and_executor(tiny_llama, monkeypatch,
                                                                                        tmp_path):
    """policy "auto" through LLM: the machine profile's shapes, the planner, each dry run and the
    executor all read the one ModelSpec and the one ModelConfig the LLM built."""
    import flexlamps.api
    import flexlamps.engine.executors.charges as charges
    import flexlamps.hardware.cache
    from flexlamps.models import description
    from flexlamps.api import LLM

    built, shapes = [], []
    real = flexlamps.api.model_spec
    monkeypatch.setattr(flexlamps.api, "model_spec", lambda *a, **k: built.append(1) or real(*a, **k))
    monkeypatch.setattr(flexlamps.hardware.cache, "machine_profile",
                        lambda scratch, on, model_shapes, expert_dims=None: shapes.append(model_shapes)
                        or placement.hardware_preset("t4-flexgen"))
    # planning, the executor, its charges and the run plan take it, required: none describes the model again
    monkeypatch.setattr(description, "model_spec", lambda *a, **k: pytest.fail("a second ModelSpec"))
    llm = LLM(str(tiny_llama), dtype="float32", gpu_mem=2 * MiB, cpu_mem=8 * MiB, offload_dir=str(tmp_path))
    # nor a second ModelConfig: the dry runs and the executor's charges read the reader's
    monkeypatch.setattr(charges.ModelConfig, "from_hf", lambda *a, **k: pytest.fail("a second ModelConfig"))
    try:
        llm.prepare(prompt_len=16, gen_len=8, num_sequences=4)
        plan = llm.run_plan
        assert llm.executor.cfg is llm.config and built == [1] and shapes == [plan.model.layer_matrix_shapes()]
        assert plan.predicted is not None and plan.policy.weights == plan.predicted.policy.weights
        assert plan.workload.prompt_len == 16 and plan.max_batch_size <= 4
        assert llm.executor.model_spec is plan.model and llm.policy is plan.policy
    finally:
        llm.close()


def test_an_executor_is_built_as_its_plan_says(reader, tmp_path):
    plan = _plan(reader, gpu_mem=4 * MiB, cpu_mem=4 * MiB, policy=SPLIT, offload_dir=str(tmp_path))
    executor = build_executor(plan, reader)
    try:
        assert executor.model_spec is plan.model and executor.policy.weights == SPLIT.weights
        assert executor.tier_use()["gpu"].capacity_bytes == 4 * MiB
    finally:
        executor.close()
    in_memory = build_executor(_plan(reader), reader)
    assert not hasattr(in_memory, "policy") and in_memory.dtype == torch.float32


def test_auto_needs_the_machine_and_budgets(reader):
    run = RunSettings.parse(reader.path, gpu_mem="2MiB")
    with pytest.raises(ValueError, match="with_budgets"):
        plan_run(run, reader.config, model_spec(reader.config), torch.float32)
    with pytest.raises(ValueError, match="pass hardware"):
        plan_run(run.with_budgets(), reader.config, model_spec(reader.config), torch.float32)


def test_augmented_pools_in_memory_default_to_four_contexts_or_as_given(reader):
    run = RunSettings.parse(reader.path, dtype="float32")
    per_token, spec = reader.config.kv_bytes_per_token(4), model_spec(reader.config)
    plan = plan_augmented(run, AugmentedSettings(max_context=64, block_size=8), reader.config, spec, torch.float32)
    assert plan.pools.gpu_kv_bytes == 4 * (64 + 8) * per_token and plan.pools.cpu_swap_bytes == 4 * 64 * per_token
    assert plan.pools.block_size == 8
    given = AugmentedSettings.parse(max_context=64, gpu_kv_mem="1MiB", cpu_swap_mem="0", seed=3)
    plan = plan_augmented(run, given, reader.config, spec, torch.float32)
    assert (plan.pools.gpu_kv_bytes, plan.pools.cpu_swap_bytes, plan.pools.seed) == (MiB, 0, 3)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        plan_augmented(run, AugmentedSettings(max_context=10 ** 6), reader.config, spec, torch.float32)


def test_a_hybrid_models_default_pools_hold_four_requests_with_their_states(hybrid_models):
    """Each request of a hybrid model also holds its DeltaNet state in blocks of the pools
    (engine.caches.paged_state): the default pools make room for four of them."""
    from flexlamps.engine.caches.paged_state import paged_state_blocks

    reader = open_checkpoint(hybrid_models["qwen3_next"])
    run = RunSettings.parse(str(hybrid_models["qwen3_next"]), dtype="float32")
    plan = plan_augmented(run, AugmentedSettings(max_context=64, block_size=8), reader.config,
                          model_spec(reader.config), torch.float32)
    block = 8 * reader.config.kv_bytes_per_token(4)
    state = paged_state_blocks(reader.config, 8, torch.float32)
    assert state > 0
    assert plan.pools.gpu_kv_bytes == 4 * (64 // 8 + 1 + state) * block
    assert plan.pools.cpu_swap_bytes == 4 * (64 // 8 + state) * block


def test_augmented_settings_refuse_bad_values_by_name():
    with pytest.raises(ValueError, match="gpu_kv_mem"):
        AugmentedSettings.parse(max_context=64, gpu_kv_mem="lots")
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        AugmentedSettings.parse(max_context=64, max_num_seqs=0)


def test_agents_refuses_policy_naming_both_kinds(tmp_path):
    from flexlamps.cli import main

    res = CliRunner().invoke(main, ["agents", "--policy", "auto", "--out", str(tmp_path)])
    errors = [line for line in res.output.splitlines() if line.startswith("Error")]
    assert res.exit_code == 2 and len(errors) == 1
    assert "--placement" in errors[0] and "--schedulers" in errors[0]


def test_the_other_commands_keep_policy_and_policies_as_aliases():
    from flexlamps.cli import main

    for name, alias, option in (("generate", "--policy", "--placement"), ("helm", "--policy", "--placement"),
                                ("plan", "--policy", "--placement"), ("simulate", "--policies", "--schedulers"),
                                ("agents", "--policies", "--schedulers")):
        params = main.get_command(None, name).params
        assert any(p.opts[:2] == [option, alias] for p in params), name


def test_no_dense_twins_where_both_phases_run_on_the_codes(monkeypatch):
    """Our decode kernel and a prompt kernel on the codes (the many-row kernel, or the int8 GEMM
    for what it does not take where the dense GEMM is fast) multiply a bf16 4-bit weight's codes in
    both phases: no dense copy of it is made (no full-model twin); an fp32 one keeps its twin, and so
    does a bf16 one where no prompt kernel takes its codes."""
    import torch

    from flexlamps.models.blocks import coded_weights
    from flexlamps.run_plan import build as run_build
    from quant.int4_weight import Int4Weight

    class Takes:
        prompts = True

        def takes(self, w):
            return True

        def takes_prompt(self, w):
            return self.prompts

    decode = Takes()
    w = Int4Weight.quantize(torch.randn(128, 128), 32, torch.bfloat16)
    monkeypatch.setattr(coded_weights, "native_kernel", lambda: decode)
    monkeypatch.setattr(coded_weights, "int8_kernel", lambda: object())
    assert not run_build._dense_twins_fit({"w": w})
    assert run_build._dense_twins_fit({"w": Int4Weight.quantize(torch.randn(128, 128), 32, torch.float32)})
    decode.prompts = False  # prompts would run the dense GEMM: a twin
    monkeypatch.setattr(coded_weights, "int8_kernel", lambda: None)
    assert run_build._dense_twins_fit({"w": w})
