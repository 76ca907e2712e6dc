"""Choose the offload policy for a run: from a policy JSON, or `auto` — the planner's LP with
this machine's measured profile (cached) and the run's memory budgets and lengths."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

import placement
from placement import HardwareSpec, Plan, Policy, WorkloadSpec

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# 2: engine's linear, weight-streaming roofline, per-layer overhead, GEMM rate by rows;
# 3: dequantization over a sweep of matrices + a per-matrix cost, the engine's allocator;
# 4: GEMM rates for resident (prepacked) weights; 5: median repetitions, a model's own
# matrices, tensor-sized disk files, gpu_is_host
PROFILE_VERSION = 5


def profile_cache_path(shapes=None) -> Path:
    """Where the profile timed on matrices of `shapes` (None: the generic ones) is cached."""
    root = os.environ.get("FLEXLAMPS_CACHE") or Path.home() / ".cache" / "flexlamps"
    # versioned: a profile written before the probes changed is measured again, not reused
    name = f"hardware-v{PROFILE_VERSION}"
    if shapes:
        import hashlib

        name += "-" + hashlib.sha256(repr(tuple(map(tuple, shapes))).encode()).hexdigest()[:12]
    return Path(root) / f"{name}.json"


def machine_profile(scratch: Path, on_measure=None, model_shapes=None) -> HardwareSpec:
    """This machine's profile: the cached one, or a quick measurement made now and cached for
    the next run. `model_shapes`: the model's layer matrices, to time GEMMs and decompression
    on (a model too big for the quick probes gets the generic profile)."""
    from flexlamps.hw_profile import GENERIC_SHAPES, gemm_probe_shapes

    shapes = gemm_probe_shapes(model_shapes, quick=True)
    path = profile_cache_path(None if shapes == GENERIC_SHAPES else shapes)
    if path.exists():
        try:
            return HardwareSpec.from_json(path.read_text())
        except (ValueError, TypeError, KeyError):
            pass  # damaged cache: measure again
    from flexlamps.hw_profile import profile_machine

    if on_measure:
        on_measure(path)
    scratch.mkdir(parents=True, exist_ok=True)
    spec = profile_machine(disk_folder=scratch, quick=True, model_shapes=model_shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec.to_json())
    os.replace(tmp, path)
    return spec


def plan_policy(hf_config: dict, dtype: torch.dtype, hardware: HardwareSpec, *, gpu_mem: int, cpu_mem: int,
                disk_bytes: int | None, prompt_len: int, gen_len: int, max_block_size: int = 256,
                allow_compression: bool = True) -> Plan:
    model = placement.ModelSpec.from_hf_config(hf_config)
    # the engine holds an FP8 checkpoint's weights dequantized to `dtype`: plan them at that size
    model = dataclasses.replace(model, dtype=_DTYPE_NAMES[dtype], weight_format="dense")
    hw = dataclasses.replace(hardware, gpu_mem_bytes=gpu_mem, cpu_mem_bytes=cpu_mem,
                             disk_bytes=max(1, disk_bytes or 1))
    workload = WorkloadSpec(prompt_len=max(1, prompt_len), gen_len=max(1, gen_len))
    from flexlamps.engine.executors.offloaded import CAPABILITIES

    return placement.solve(model, hw, workload, max_block_size=max_block_size, capabilities=CAPABILITIES,
                           allow_weight_compression=allow_compression, allow_cache_compression=allow_compression)


def load_policy(path: str | Path) -> Policy:
    try:
        return Policy.from_json(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist; pass --policy auto or a policy JSON") from None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as e:
        raise ValueError(f"policy file {path} is not a valid policy: {e}") from None
