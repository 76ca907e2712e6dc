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
from flexlamps.models.description import model_spec_from_hf
from flexlamps.planning.dry_run import dry_run
from offload import BudgetExceededError
from placement import HardwareSpec, ModelSpec, Plan, Policy, WorkloadSpec

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def plan_policy(hf_config: dict, dtype: torch.dtype, hardware: HardwareSpec, *, gpu_mem: int, cpu_mem: int,
                disk_bytes: int | None, prompt_len: int, gen_len: int, max_block_size: int = 256,
                allow_compression: bool = True, compress_weight: bool | None = None,
                compress_cache: bool | None = None, prefix_len: int = 0, routing=None,
                model: ModelSpec | None = None, weight_quant: str | None = None, config=None,
                logits_per_row: int = 1) -> Plan:
    """The planner's policy for this run at the user's budgets, checked once by the executor's dry
    run: the planner's memory rows charge what the engine charges (the property tests hold dense
    models' peaks to the dry run's within 2%, MoE and MLA within 10%), and it plans for 90% of a tier, so
    a plan it accepts runs; one the engine would still refuse is an error naming the tier, never
    re-planned.
    `prompt_len`: the longest prompt (the cache holds it); `prefix_len`: a prefix shared by the
    prompts, held in a one-row cache beside the block's.
    `compress_weight`/`compress_cache`: the user's choice (True: planned with it on, so the plan
    prices what runs; False: off; None: the planner's choice where `allow_compression`).
    `routing`: a MoE model's measured `placement.routing.RoutingProfile` (the experts a step
    reads are priced from it; None: uniform routing). `model`, `config`: the run's ModelSpec and
    ModelConfig (the run plan builds them once), else built from `hf_config`. `weight_quant`: the
    weight compression backend the executor runs (groupwise8's 8-bit weights are charged as such).
    `logits_per_row`: a prompt row's positions whose logits the prefill returns (scoring: all of
    them, `dry_run`)."""
    spec = model or model_spec_from_hf(hf_config)
    # an FP8 checkpoint's matrices stay FP8 in the engine (upcast per call): planned as stored
    model = dataclasses.replace(spec, dtype=_DTYPE_NAMES[dtype], routing=routing)
    workload = WorkloadSpec(prompt_len=max(1, prompt_len), gen_len=max(1, gen_len))
    options = dict(max_block_size=max_block_size,
                   allow_weight_compression=_allowed(compress_weight, allow_compression),
                   allow_cache_compression=_allowed(compress_cache, allow_compression),
                   require_weight_compression=bool(compress_weight), require_cache_compression=bool(compress_cache))
    hw = dataclasses.replace(hardware, gpu_mem_bytes=gpu_mem, cpu_mem_bytes=cpu_mem, disk_bytes=max(1, disk_bytes or 1))
    plan = placement.solve(model, hw, workload, capabilities=CAPABILITIES, **options)
    short = _dry_run_shortfall(hf_config, plan.policy, dtype, gpu_mem, cpu_mem, workload, prefix_len, routing,
                               spec, weight_quant, config, logits_per_row)
    if short is not None:
        tier, nbytes = short
        raise placement.InfeasiblePlanError(f"{tier} tier (as the engine charges it)", nbytes,
                                            {"gpu": gpu_mem, "cpu": cpu_mem}[tier],
                                            hint=f"give the {tier} tier more room (--{tier}-mem)")
    return plan


def _dry_run_shortfall(hf_config: dict, policy: Policy, dtype: torch.dtype, gpu_mem: int, cpu_mem: int,
                       workload: WorkloadSpec, prefix_len: int, routing=None,
                       model: ModelSpec | None = None, weight_quant: str | None = None,
                       config=None, logits_per_row: int = 1) -> tuple[str, int] | None:
    """(tier, bytes short) where the executor would exceed its budgets running `policy`, else None."""
    try:
        dry_run(hf_config, policy, gpu_mem=gpu_mem, cpu_mem=cpu_mem, prompt_len=workload.prompt_len,
                gen_len=workload.gen_len, dtype=dtype, prefix_len=prefix_len, routing=routing, model_spec=model,
                weight_quant=weight_quant, config=config, logits_per_row=logits_per_row)
    except BudgetExceededError as e:
        return e.tier, e.shortfall_bytes
    return None


def _allowed(asked: bool | None, allow: bool) -> bool:
    return allow if asked is None else asked


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
