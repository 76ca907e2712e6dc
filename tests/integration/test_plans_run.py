"""A plan the planner calls feasible runs within its budgets: the built-in model at its default
dtype over a grid of budgets (gpu 8-512 MiB x cpu 16-512 MiB, with and without a disk tier),
planned for the workload generate hands it (prompts of different lengths sharing a prefix).

Every feasible plan passes the executor's dry run (which charges what the executor charges:
`test_plan_engine_agreement.py`); the engine itself runs the issue's budgets (and under `slow`
a grid of them). The machine profile is a fixed preset, so the plans do not depend on the box.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import placement
from flexlamps.api import planning_lengths
from flexlamps.engine.batch.generate import MIN_SHARED_PREFIX
from flexlamps.planning import policy_choice
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.target import BlockLengths, Compression
from tests.described import plan_target

MiB = 1 << 20
HARDWARE = "t4-flexgen"
GPU_MIB = (8, 12, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512)
CPU_MIB = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
COARSE = (list(itertools.product((8, 24, 40, 128, 512), (16, 48, 512))))
DISK = 8 << 30
# 16 prompts sharing 20 tokens, 48 new tokens (the issue's run): 15 of 23-51 tokens and one of
# 180, so a plan made for the mean prompt (as before) under-plans the cache and the prefill
NUM_PROMPTS, SHARED, GEN_LEN, LONGEST = 16, 20, 48, 180
PROMPTS = [[1] + [100 + j for j in range(SHARED - 1)] + [300 + 7 * i + j for j in range(3 + 2 * i)]
           for i in range(NUM_PROMPTS - 1)]
PROMPTS.append(PROMPTS[0][:SHARED] + [900 + j for j in range(LONGEST - SHARED)])


@pytest.fixture(scope="module")
def builtin(smollm2_path):
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.settings import RunSettings

    reader = open_checkpoint(smollm2_path)
    # the default dtype: bf16, its blocks in place
    return plan_target(reader.config, RunSettings().resolve_dtype(reader))


def test_plans_are_made_for_the_longest_prompt_and_the_shared_prefix():
    """generate's cache holds the longest prompt (the mean under-planned it: BudgetExceededError
    on the cpu tier's cache or the gpu tier's staging) and the shared prefix in a cache of its own."""
    assert planning_lengths(PROMPTS) == (LONGEST, SHARED)
    assert planning_lengths([[5, 6, 7], [5, 6, 8, 9]]) == (4, 0)  # under MIN_SHARED_PREFIX: no prefix cache
    assert MIN_SHARED_PREFIX <= SHARED


def _check_grid(target, points, disk: int | None) -> int:
    """Plan at every point; each feasible plan must pass the dry run. Returns how many were."""
    hw = placement.hardware_preset(HARDWARE)
    longest, shared = planning_lengths(PROMPTS)
    feasible = 0
    for gpu, cpu in points:
        budgets = dict(gpu_mem=gpu * MiB, cpu_mem=cpu * MiB)
        try:
            plan = policy_choice.plan_policy(target, hw, BlockLengths(prompt_len=longest, gen_len=GEN_LEN,
                                                                      prefix_len=shared),
                                             disk_bytes=disk, max_block_size=NUM_PROMPTS,
                                             compression=Compression(allow=False), **budgets)
        except placement.InfeasiblePlanError:
            continue
        feasible += 1
        # what generate holds: the longest prompt's cache rows, the prefix's own cache
        dry_run(target, plan.policy, BlockLengths(prompt_len=LONGEST, gen_len=GEN_LEN, prefix_len=SHARED),
                **budgets)  # raises BudgetExceededError where the engine would
    return feasible


@pytest.mark.parametrize("disk", [None, DISK], ids=["no-disk", "disk"])
def test_every_feasible_plan_passes_the_dry_run_coarse(builtin, disk):
    assert builtin.dtype == torch.bfloat16
    assert _check_grid(builtin, COARSE, disk) >= (3 if disk is None else 8)


@pytest.mark.slow
@pytest.mark.parametrize("disk", [None, DISK], ids=["no-disk", "disk"])
def test_every_feasible_plan_passes_the_dry_run_fine(builtin, disk):
    assert _check_grid(builtin, itertools.product(GPU_MIB, CPU_MIB), disk) >= (40 if disk is None else 100)


def test_a_plan_the_dry_run_refuses_is_an_error_not_a_replan(builtin, monkeypatch):
    """One memory model: the plan is made once, at the user's budgets. Where the engine would
    still charge more than a tier holds, planning stops with the tier and the shortfall (no loop
    of plans with less room); the plan the dry run passes is the planner's own."""
    common = dict(gpu_mem=64 * MiB, cpu_mem=512 * MiB, disk_bytes=None, max_block_size=NUM_PROMPTS,
                  compression=Compression(allow=False))
    hw, lengths = placement.hardware_preset(HARDWARE), BlockLengths(prompt_len=53, gen_len=GEN_LEN)
    plan = policy_choice.plan_policy(builtin, hw, lengths, **common)
    assert plan.budget_bytes["gpu"] == pytest.approx(0.9 * 64 * MiB)
    calls = []
    monkeypatch.setattr(policy_choice, "_dry_run_shortfall", lambda *args: calls.append(args) or ("gpu", 4 * MiB))
    with pytest.raises(placement.InfeasiblePlanError, match="gpu tier .as the engine charges it.: needs 4.0 MiB"):
        policy_choice.plan_policy(builtin, hw, lengths, **common)
    assert len(calls) == 1


def _generate_within(model, gpu: int, cpu: int, tmp_path, monkeypatch, prompts, gen_len: int):
    """Run the built-in model at its default dtype, planned with the preset machine."""
    import flexlamps.hardware.cache
    from flexlamps import LLM, SamplingParams

    monkeypatch.setattr(flexlamps.hardware.cache, "machine_profile",
                        lambda *a, **k: placement.hardware_preset(HARDWARE))
    llm = LLM(str(model), gpu_mem=gpu * MiB, cpu_mem=cpu * MiB, offload_dir=tmp_path / "off")
    try:
        llm.generate_ids(prompts, [SamplingParams(max_new_tokens=gen_len, ignore_eos=True)] * len(prompts))
    except placement.InfeasiblePlanError:
        return None
    finally:
        llm.close()
    use = llm.executor.tier_use()
    assert use["gpu"].peak_bytes <= gpu * MiB and use["cpu"].peak_bytes <= cpu * MiB
    return use


def test_the_issues_budgets_run(smollm2_path, tmp_path, monkeypatch):
    """--gpu-mem 24MiB --cpu-mem 512MiB planned, then stopped staging layers.1.up_proj; here the
    first prefill and decode steps run (a short run of the same prompts: the peaks come first)."""
    assert _generate_within(smollm2_path, 24, 512, tmp_path, monkeypatch, PROMPTS[:3] + PROMPTS[-1:], 2) is not None


@pytest.mark.slow
@pytest.mark.parametrize("gpu,cpu", [(40, 512), (24, 48), (16, 24), (8, 16), (128, 48)])
def test_plans_run_within_their_budgets(smollm2_path, gpu, cpu, tmp_path, monkeypatch):
    _generate_within(smollm2_path, gpu, cpu, tmp_path, monkeypatch, PROMPTS, 4)


def test_deepseek_v32_with_a_wide_head_runs_in_12_mib_and_equals_in_memory(tmp_path, monkeypatch):
    """A tiny DeepSeek-V3.2 (MLA, indexer, MoE) with a 49,152-token head: at 12 MiB the head's
    rows off the gpu tier are staged there in chunks, which the plan must leave room for (it
    stopped with 'staging rows of lm_head.rows...'); float32 output equals the in-memory run's."""
    import flexlamps.hardware.cache
    from flexlamps import LLM, SamplingParams
    from tests.checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "v32", "deepseek_v32", vocab_size=49152)
    monkeypatch.setattr(flexlamps.hardware.cache, "machine_profile", lambda *a, **k: placement.hardware_preset(HARDWARE))
    prompts, params = [[0, 5, 17, 33, 60, 2, 9], [0, 5, 17, 40, 61]], [SamplingParams(max_new_tokens=4, ignore_eos=True)]
    offloaded = LLM(str(folder), gpu_mem=12 * MiB, cpu_mem=256 * MiB, offload_dir=tmp_path / "off")
    try:
        got = [o.token_ids for o in offloaded.generate_ids(prompts, params * 2)]
    finally:
        offloaded.close()
    assert offloaded.policy.weights.gpu < 1 and offloaded.executor.tier_use()["gpu"].peak_bytes <= 12 * MiB
    assert got == [o.token_ids for o in LLM(str(folder)).generate_ids(prompts, params * 2)]
