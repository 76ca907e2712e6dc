"""The machine profile `--policy auto` plans with: cached in the cache folder per probed matrices,
measured on first use and again when it was taken on a busy machine (the load average it was
measured under, or a quick GEMM now faster than then, says so).
"""

import json
import os
import warnings
from pathlib import Path

import torch

from flexlamps.hardware import machine
from flexlamps.hardware import profile_path
from flexlamps.cores import usable_cores
from flexlamps.hardware.probes import GENERIC_SHAPES, gemm_probe_shapes, typical_rate
from flexlamps.models.blocks.linear import linear
from placement import HardwareSpec

# A cached profile is measured again when a quick GEMM now runs this much faster than it did
# right after the profile was taken: that profile was measured on a busy machine (one cached
# at 57 GFLOP/s bf16 where a quiet box gives about 200 kept plans slow for good). A slower
# check keeps the cache: the box is busy now, and the quiet-box profile is the better guess.
STALE_PROFILE_SPEEDUP = 1.5
_CHECK_DIM = 256
_CHECK_BUDGET_S = 0.03
# ... and when the load average as it was measured, plus its probes' threads, came to this many times
# the cores: each probe got ~1/1.5 of the CPU it asked for, so compute was priced slow (a MoE job's
# profile taken on a busy box gave measured/predicted 1.29 where quiet ones give 0.85-0.92). The GEMM
# check misses that: its ~0.3 ms calls mostly run whole within one time slice. Measured again only
# once the box is below it (else kept, with a warning): a profile measured under load is no better.
BUSY_CONTENTION = 1.5


def check_rate() -> float:
    """FLOP/s of a small fp32 GEMM through the engine's `linear` (median of ~30 ms of calls): a
    cheap reading of how much of the CPU this process gets right now."""
    a = torch.randn(_CHECK_DIM, _CHECK_DIM)
    b = torch.randn(_CHECK_DIM, _CHECK_DIM)
    return typical_rate(lambda: linear(a, b), 2.0 * _CHECK_DIM**3, _CHECK_BUDGET_S)


def contention(load: float) -> float:
    """Runnable threads per core were this process's compute threads added to `load` (a load average)."""
    return (load + torch.get_num_threads()) / usable_cores()


def profile_cache_path(shapes=None, expert_dims=None) -> Path:
    """Where this process's profile (at its torch thread count) for `shapes` / `expert_dims` is cached."""
    return profile_path.profile_cache_path(torch.get_num_threads(), shapes, expert_dims)


def _check_path(path: Path) -> Path:
    return path.with_name(path.stem + ".check.json")


def _cached_profile(path: Path) -> tuple[HardwareSpec | None, str]:
    """(the cached profile at `path`, "") if it can be used, else (None, why it is measured)."""
    if not path.exists():
        return None, "first run"
    try:
        spec = HardwareSpec.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None, "the cached profile is damaged"
    try:
        check = json.loads(_check_path(path).read_text())
        recorded = float(check["gemm_flops"])
    except (OSError, ValueError, TypeError, KeyError):
        return spec, ""  # no check beside it (written by hand, or by an older flexlamps): trusted
    then = check.get("load")  # None: checked by an older flexlamps, which did not record it
    if isinstance(then, (int, float)) and contention(then) > BUSY_CONTENTION:
        load = os.getloadavg()[0]
        if contention(load) <= BUSY_CONTENTION:
            return None, f"it was measured under load {then:.1f} on {usable_cores()} cores, {load:.1f} now"
        warnings.warn(f"flexlamps: the machine profile {path} was measured under load {then:.1f} on {usable_cores()} "
                      f"cores, so it prices compute slow; kept, the box being as busy now ({load:.1f}): it is "
                      "measured again once the box is quieter", stacklevel=3)
        return spec, ""
    now = check_rate()
    if now > STALE_PROFILE_SPEEDUP * recorded:
        return None, (f"it was measured on a busy machine (a quick GEMM ran {now / recorded:.1f}x "
                      f"slower then than now)")
    return spec, ""


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def machine_profile(scratch: Path, on_measure=None, model_shapes=None, expert_dims=None) -> HardwareSpec:
    """This machine's profile: the cached one, or a quick measurement made now and cached for
    the next run. `model_shapes`: the model's layer matrices, to time GEMMs and decompression
    on (a model too big for the quick probes gets the generic profile); `expert_dims`: a MoE
    model's routed experts' (hidden, width) (`ModelSpec.routed_expert_dims`), to time them on.
    `on_measure(path, why)` is told before a measurement."""
    shapes = gemm_probe_shapes(model_shapes, quick=True)
    path = profile_cache_path(None if shapes == GENERIC_SHAPES else shapes, expert_dims)
    spec, why = _cached_profile(path)
    if spec is not None:
        return spec
    if on_measure:
        on_measure(path, why)
    scratch.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]  # before the probes, which add their own threads
    if contention(load) > BUSY_CONTENTION:
        warnings.warn(f"flexlamps: measuring the machine profile {path} under load {load:.1f} on {usable_cores()} cores:"
                      " it prices compute slow until it is measured again on a quieter box", stacklevel=2)
    spec = machine.profile_machine(disk_folder=scratch, quick=True, model_shapes=model_shapes, expert_dims=expert_dims)
    _write_atomic(path, spec.to_json())
    _write_atomic(_check_path(path), json.dumps({"gemm_flops": check_rate(), "load": load, "cores": usable_cores()}))
    return spec
