"""Choose the offload policy for a run: from a policy JSON, or `auto`: the planner's LP with
this machine's profile (flexlamps.hardware.cache.machine_profile, passed in) and the run's memory
budgets and lengths."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

import placement
from flexlamps.models.description import model_spec_from_hf
from placement import HardwareSpec, Plan, Policy, WorkloadSpec

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def plan_policy(hf_config: dict, dtype: torch.dtype, hardware: HardwareSpec, *, gpu_mem: int, cpu_mem: int,
                disk_bytes: int | None, prompt_len: int, gen_len: int, max_block_size: int = 256,
                allow_compression: bool = True, compress_weight: bool | None = None,
                compress_cache: bool | None = None) -> Plan:
    """The planner's policy for this run. `compress_weight`/`compress_cache`: the user's choice
    (True: planned with it on, so the plan prices what runs; False: off; None: the planner's
    choice where `allow_compression`)."""
    # an FP8 checkpoint's matrices stay FP8 in the engine (upcast per call): planned as stored
    model = dataclasses.replace(model_spec_from_hf(hf_config), dtype=_DTYPE_NAMES[dtype])
    hw = dataclasses.replace(hardware, gpu_mem_bytes=gpu_mem, cpu_mem_bytes=cpu_mem,
                             disk_bytes=max(1, disk_bytes or 1))
    workload = WorkloadSpec(prompt_len=max(1, prompt_len), gen_len=max(1, gen_len))
    from flexlamps.engine.executors.offloaded import CAPABILITIES

    return placement.solve(model, hw, workload, max_block_size=max_block_size, capabilities=CAPABILITIES,
                           allow_weight_compression=_allowed(compress_weight, allow_compression),
                           allow_cache_compression=_allowed(compress_cache, allow_compression),
                           require_weight_compression=bool(compress_weight),
                           require_cache_compression=bool(compress_cache))


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
