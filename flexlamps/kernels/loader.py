"""The one loader of flexlamps' C kernels: which of them run in this process, decided once.

Each kernel module here (`NAMES`) defines `KERNEL`, a `Kernel`: its library (source, compile and
CPU flags), how to wrap the loaded library, and a check against torch's arithmetic that raises
`KernelCheckError` (never `assert`: it must hold under `python -O`). `chosen()` is the process's
`Kernels`: a kernel is loaded on first use from the cache folder (built there once per machine),
or not where $FLEXLAMPS_NATIVE_KERNELS=0, the CPU lacks its instructions or has ones that make
torch's own faster. Anything else that stops it (no compiler, a failed build, a library that does
not load, a check that fails or raises) leaves torch's kernels running, with one warning naming
the kernel, why and what runs instead. `flexlamps env` prints each kernel's `Outcome`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

from flexlamps.cache_folder import cache_root
from flexlamps.kernels import build

SWITCH_ENV = "FLEXLAMPS_NATIVE_KERNELS"  # "0": torch's kernels everywhere (A/B runs, a broken toolchain)
NAMES = ("tile_gemv", "int8_gemm", "attention", "elementwise")  # the kernel modules of this package


class KernelCheckError(RuntimeError):
    """A kernel's result differs from the plain computation it replaces."""


def require(ok: bool, message: str) -> None:
    """A load check's condition: raises KernelCheckError with `message` where it does not hold."""
    if not ok:
        raise KernelCheckError(message)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One C kernel: its library, `make` (the loaded library -> the object callers use) and `check`
    (raises on a wrong result). Where the CPU has `faster_flags`, torch's own runs (`faster_why`)."""
    name: str
    library: build.Library
    make: Callable[[Any], Any]
    check: Callable[[Any], None]
    faster_flags: tuple[str, ...] = ()
    faster_why: str = ""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What loading a kernel gave: the object (None unless `state` is "loaded") and why."""
    kernel: Any
    state: str  # "loaded", "disabled" (by the switch or the CPU) or "failed" (with a warning)
    why: str


def switched_off() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip() == "0"


def disabled_because(kernel: Kernel) -> str | None:
    """Why `kernel` is not even tried in this process, or None."""
    if switched_off():
        return f"${SWITCH_ENV}=0"
    if not build.cpu_has_flags(kernel.library.cpu_flags):
        have = build.cpu_flags()
        missing = [flag for flag in kernel.library.cpu_flags if flag not in have] or kernel.library.cpu_flags
        return f"this CPU lacks {' '.join(missing)}"
    if kernel.faster_flags and build.cpu_has_flags(kernel.faster_flags):
        return kernel.faster_why
    return None


def load(kernel: Kernel, folder: Path) -> Outcome:
    """`kernel` built into (or found in) `folder`, wrapped and checked; see the module's docstring."""
    why = disabled_because(kernel)
    if why is not None:
        return Outcome(None, "disabled", why)
    try:
        made = kernel.make(build.built_library(kernel.library.source, kernel.library.compile_flags, Path(folder)))
        kernel.check(made)
    except Exception as err:  # noqa: BLE001  (whatever stops a kernel, torch's run instead)
        why = _reason(err)
        warnings.warn(f"flexlamps: {kernel.library.what} is not used ({why}); {kernel.library.fallback}",
                      RuntimeWarning, stacklevel=3)
        return Outcome(None, "failed", why)
    return Outcome(made, "loaded", "built and checked against torch")


def _reason(err: Exception) -> str:
    if isinstance(err, build.NoCompiler):
        return "no C compiler found: set $CC"
    detail = err.stderr if isinstance(err, subprocess.CalledProcessError) and err.stderr else err
    return f"{type(err).__name__}: {str(detail).strip()[-500:]}"


def kernel_spec(name: str) -> Kernel:
    """The `KERNEL` of module flexlamps.kernels.<name>."""
    if name not in NAMES:
        raise KeyError(f"no native kernel named {name!r} (there are {', '.join(NAMES)})")
    return importlib.import_module(f"flexlamps.kernels.{name}").KERNEL


class Kernels:
    """The kernels one process runs, each loaded on first use from `folder` (thread-safe)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._outcomes: dict[str, Outcome] = {}
        self._lock = threading.Lock()

    def outcome(self, name: str) -> Outcome:
        with self._lock:
            if name not in self._outcomes:
                self._outcomes[name] = load(kernel_spec(name), self.folder)
            return self._outcomes[name]

    def get(self, name: str) -> Any:
        """The loaded kernel `name`, or None where torch's runs instead."""
        return self.outcome(name).kernel


@functools.lru_cache(maxsize=None)
def chosen() -> Kernels:
    """This process's kernels, built into the cache folder's `kernels/`."""
    return Kernels(cache_root() / "kernels")
