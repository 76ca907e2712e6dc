"""Choose the offload policy for a run: from a policy JSON, or `auto`: the planner's LP with
this machine's profile (flexlamps.hardware.cache.machine_profile, passed in) and the run's memory
budgets and lengths."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

import placement
from flexlamps.engine.executors.offloaded import CAPABILITIES
from flexlamps.engine.executors.weight_store import in_place_bytes
from flexlamps.models.description import with_codes
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.target import BlockLengths, Compression, PlanTarget
from offload import BudgetExceededError
from placement import HardwareSpec, Plan, Policy, WorkloadSpec

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def plan_policy(target: PlanTarget, hardware: HardwareSpec, lengths: BlockLengths, *, gpu_mem: int, cpu_mem: int,
                disk_bytes: int | None, max_block_size: int = 256, compression: Compression = Compression()) -> Plan:
    """The planner's policy for `target` at the user's budgets, for blocks of at most
    `max_block_size` sequences of `lengths`, checked once by the executor's dry run: the planner's
    memory rows charge what the engine charges (the property tests hold dense, MLA and MoE models'
    peaks per tier to the dry run's within 2%: `placement.staging` stages a MoE layer as the
    engine's placement leaves it), and it plans for 90% of a tier, so a plan it accepts runs; one
    the engine would still refuse is an error naming the tier, never re-planned.
    A MoE target's routing profile prices the experts a step reads (None: uniform routing); the
    shared prefix is charged by the dry run (the planner plans the longest prompt)."""
    # an FP8 checkpoint's matrices stay FP8 in the engine (upcast per call): planned as stored; a
    # GGUF's blocks kept as codes at the bytes their kind stores them in, as the dry run charges them
    model = target.model if not target.in_place else with_codes(target.model, target.config,
                                                                  in_place_bytes(target.in_place))
    model = dataclasses.replace(model, dtype=_DTYPE_NAMES[target.dtype], routing=target.routing)
    workload = WorkloadSpec(prompt_len=max(1, lengths.prompt_len), gen_len=max(1, lengths.gen_len))
    hw = dataclasses.replace(hardware, gpu_mem_bytes=gpu_mem, cpu_mem_bytes=cpu_mem, disk_bytes=max(1, disk_bytes or 1))
    plan = placement.solve(model, hw, workload, capabilities=CAPABILITIES, max_block_size=max_block_size,
                           **compression.solve_options())
    checked = dataclasses.replace(lengths, prompt_len=workload.prompt_len, gen_len=workload.gen_len)
    short = _dry_run_shortfall(target, plan.policy, checked, gpu_mem, cpu_mem)
    if short is not None:
        tier, nbytes = short
        raise placement.InfeasiblePlanError(f"{tier} tier (as the engine charges it)", nbytes,
                                            {"gpu": gpu_mem, "cpu": cpu_mem}[tier],
                                            hint=f"give the {tier} tier more room (--{tier}-mem)")
    return plan


def _dry_run_shortfall(target: PlanTarget, policy: Policy, lengths: BlockLengths, gpu_mem: int,
                       cpu_mem: int) -> tuple[str, int] | None:
    """(tier, bytes short) where the executor would exceed its budgets running `policy`, else None."""
    try:
        dry_run(target, policy, lengths, gpu_mem=gpu_mem, cpu_mem=cpu_mem)
    except BudgetExceededError as e:
        return e.tier, e.shortfall_bytes
    return None


def load_policy(path: str | Path) -> Policy:
    try:
        return Policy.from_json(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist; pass --policy auto or a policy JSON") from None
    except OSError as e:
        raise ValueError(f"policy file {path}: cannot read it ({e.strerror}); pass --policy auto or a policy "
                         "JSON") from None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as e:
        raise ValueError(f"policy file {path} is not a valid policy: {e}") from None
