"""What a bug report needs to know about this installation and machine: versions, the CPU's
features, the GPU, each native kernel (loaded, disabled or failed, and why), the cache folder and
the hardware profiles. Part of the Python API (`flexlamps env` prints it); torch is imported only
when the report is made."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import warnings

import flexlamps
from flexlamps.cache_folder import CACHE_ENV, cache_root
from flexlamps.hardware.profile_path import profile_cache_path
from flexlamps.kernels import build, loader, variants

# CPU flags that decide which kernels run (theirs, AMX, AVX-512 BF16), in /proc/cpuinfo's names
_RELEVANT_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vbmi", "avx512_vnni",
                   "avx512_bf16", "amx_bf16")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict:
    import torch

    return {"flexlamps": f"{flexlamps.__version__} ({os.path.dirname(flexlamps.__file__)})",
            "python": f"{platform.python_version()} ({sys.executable})", "torch": torch.__version__,
            "transformers": _version("transformers") or "not installed"}


def _cpu() -> dict:
    have = build.cpu_flags()
    name = next((line.split(":", 1)[1].strip() for line in _cpuinfo_lines() if line.startswith("model name")),
                platform.processor() or platform.machine())
    return {"model": name, "cores": os.cpu_count(), "features": [f for f in _RELEVANT_FLAGS if f in have],
            "lacks": [f for f in _RELEVANT_FLAGS if f not in have]}


def _cpuinfo_lines() -> list[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            return handle.read().splitlines()
    except OSError:
        return []


def _gpu() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"none (torch {torch.__version__} sees no CUDA device)"
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.1f} GiB (CUDA {torch.version.cuda}, {torch.cuda.device_count()} devices)"


def _kernels() -> dict:
    """The CPU level the kernels run at, and each native kernel: loaded (built and checked, in
    which variant), disabled or failed, and why."""
    level = variants.process_level()
    kernels = loader.chosen()
    with warnings.catch_warnings():  # a kernel that fails warns; its line below says the same, once
        warnings.filterwarnings("ignore", message="flexlamps: .* is not used", category=RuntimeWarning)
        outcomes = {name: kernels.outcome(name) for name in loader.NAMES}
    report = {"cpu variant": level or variants.BELOW_BASELINE}
    return report | {name: {"state": o.state, "variant": o.variant, "why": o.why} for name, o in outcomes.items()}


def _profiles() -> dict:
    import torch  # deferred, as in the rest of this module

    generic = profile_cache_path(torch.get_num_threads())
    per_model = sorted(p.name for p in generic.parent.glob(f"{generic.stem}-*.json") if not p.stem.endswith(".check"))
    return {"cache folder": _cache_folder(cache_root()),
            "hardware profile": f"{generic} ({'measured' if generic.exists() else 'not measured yet: the first --policy auto run or `flexlamps profile` measures it'})",
            "per-model profiles": per_model}


def _cache_folder(root) -> str:
    """The cache folder, and what stops flexlamps keeping its caches there, if anything."""
    fix = f"remove it or set ${CACHE_ENV} to a folder"
    if root.exists() and not root.is_dir():
        return f"{root} (a file, not a folder: no cache can be kept there; {fix})"
    blocker = next((p for p in root.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{root} (under {blocker}, which is a file: no cache can be kept there; remove that file or set " \
               f"${CACHE_ENV} to a folder)"
    if root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        return f"{root} (not writable: no cache can be kept there; {fix})"
    return str(root)


def environment() -> dict:
    """Versions, CPU, GPU, each native kernel's state and why, the cache folder and the hardware
    profiles, as `flexlamps env` prints them."""
    return {**_versions(), "cpu": _cpu(), "gpu": _gpu(), "native kernels": _kernels(), **_profiles()}
