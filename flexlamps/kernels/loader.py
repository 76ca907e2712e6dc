"""The one loader of flexlamps' C kernels: which of them run in this process, and which
instruction-set variant of each, decided once.

Each kernel module here (`NAMES`) defines `KERNEL`, a `Kernel`: its C source and the variants it
is built in (`flexlamps.kernels.variants`: AVX2 + FMA + F16C, AVX-VNNI, AVX-512 ...), how to wrap
the loaded library, and a check against torch's arithmetic that raises `KernelCheckError` (never
`assert`: it must hold under `python -O`). `chosen()` is the process's `Kernels`: a kernel is
loaded on first use, in its best variant at or below the process's level (the CPU's best, or
$FLEXLAMPS_CPU_VARIANT) that the CPU has and the process can run (`Kernel.unfit`), from the cache folder (built there once per machine
and variant); or not where $FLEXLAMPS_NATIVE_KERNELS=0, the CPU has none of its variants or has
instructions that make torch's own faster. Anything else that stops it (no compiler, a failed
build, a library that does not load, a check that fails or raises) leaves torch's kernels
running, with one warning naming the kernel, why and what runs instead; but a variant the compiler
refuses (gcc before 11 knows no -mamx-tile, -mavxvnni) gives way to the kernel's variant below it,
which runs if it builds (`_below_for_compiler`, `share_pool`). `flexlamps env` prints
each kernel's `Outcome`, its variant included.
"""
from __future__ import annotations

import ctypes
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
from flexlamps.kernels import build, variants
from flexlamps.kernels.variants import Variant

SWITCH_ENV = "FLEXLAMPS_NATIVE_KERNELS"  # "0": torch's kernels everywhere (A/B runs, a broken toolchain)
NAMES = ("tile_gemv", "int8_gemm", "attention", "elementwise", "half_gemv", "half_gemm", "half_amx", "decode_layers")  # the kernel modules of this package


class KernelCheckError(RuntimeError):
    """A kernel's result differs from the plain computation it replaces."""


def fits_any(variant: Variant) -> str | None:
    """`Kernel.unfit`'s default: every variant runs in any process the CPU allows."""
    return None


def require(ok: bool, message: str) -> None:
    """A load check's condition: raises KernelCheckError with `message` where it does not hold."""
    if not ok:
        raise KernelCheckError(message)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One C kernel: its source, the variants it is built in (lowest level first), `make` (the
    loaded library and its level -> the object callers use) and `check` (raises on a wrong result);
    for a warning, what it is and what runs without it. Where the CPU has `faster_flags`, torch's
    own runs (`faster_why`). `unfit(variant)` says why this process cannot run a variant the CPU
    has (tile_gemv's AVX-512 variants take torch's 64-row int4 tiles, which torch lays out only at its
    AVX-512 level: $ATEN_CPU_CAPABILITY=avx2 gives 32), else None; the best variant below runs."""
    name: str
    source: Path
    variants: tuple[Variant, ...]
    what: str
    fallback: str
    make: Callable[[Any, str], Any]
    check: Callable[[Any], None]
    faster_flags: tuple[str, ...] = ()
    faster_why: str = ""
    unfit: Callable[[Variant], str | None] = fits_any

    def variant(self, level: str) -> Variant:
        """The variant built for `level` (KeyError naming the ones there are)."""
        for candidate in self.variants:
            if candidate.level == level:
                return candidate
        raise KeyError(f"{self.name} has no {level} variant (it has {', '.join(v.level for v in self.variants)})")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What loading a kernel gave: the object (None unless `state` is "loaded"), why, and the
    variant (the level it was built for; None where none was tried)."""
    kernel: Any
    state: str  # "loaded", "disabled" (by the switch or the CPU) or "failed" (with a warning)
    why: str
    variant: str | None = None


def switched_off() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip() == "0"


def pick(kernel: Kernel, level: str | None = None) -> Variant | str:
    """The variant of `kernel` this process runs (at most `level`, else the process's level), or why
    none is tried. Raises variants.VariantRefused for an override the CPU lacks."""
    if switched_off():
        return f"${SWITCH_ENV}=0"
    have = build.cpu_flags()
    cap = level if level is not None else variants.process_level(have)
    if cap is None:
        return variants.BELOW_BASELINE
    chosen = variants.best(offered(kernel), cap, have)
    if chosen is None and (unfit := variants.best(kernel.variants, cap, have)) is not None:
        return f"{unfit.level}: {kernel.unfit(unfit)}"
    if chosen is None:
        lowest = kernel.variants[0]
        return f"this CPU lacks {' '.join(f for f in lowest.cpu_flags if f not in have) or lowest.level}"
    # torch's faster path counts only at the CPU's own level: a variant forced below it (say avx2 on an
    # AMX CPU) runs as a CPU of that level, whose prompts take the codes, not a dense copy
    at_best = cap == variants.cpu_levels(have)[-1]
    if at_best and kernel.faster_flags and all(flag in have for flag in kernel.faster_flags):
        return kernel.faster_why
    return chosen


def offered(kernel: Kernel) -> tuple[Variant, ...]:
    """`kernel`'s variants this process can run (`Kernel.unfit`), lowest first."""
    return tuple(v for v in kernel.variants if kernel.unfit(v) is None)


def load(kernel: Kernel, folder: Path, level: str | None = None) -> Outcome:
    """`kernel` in its variant for `level` (None: the process's), built into (or found in) `folder`,
    wrapped and checked; see the module's docstring."""
    chosen = pick(kernel, level)
    if isinstance(chosen, str):
        return Outcome(None, "disabled", chosen)
    try:
        library = build.built_library(kernel.source, chosen.compile_flags, Path(folder))
        share_pool(library, Path(folder), level)
        made = kernel.make(library, chosen.level)
        kernel.check(made)
    except Exception as err:  # noqa: BLE001  (whatever stops a kernel, torch's run instead)
        why = _reason(err)
        if (lower := _below_for_compiler(kernel, chosen, err, Path(folder))) is not None:
            warnings.warn(f"flexlamps: {kernel.what} ({chosen.level}) is not used ({why}); its {lower.variant} "
                          f"variant runs", RuntimeWarning, stacklevel=3)
            return lower
        warnings.warn(f"flexlamps: {kernel.what} ({chosen.level}) is not used ({why}); {kernel.fallback}",
                      RuntimeWarning, stacklevel=3)
        return Outcome(None, "failed", why, chosen.level)
    return Outcome(made, "loaded", "built and checked against torch", chosen.level)


def _below_for_compiler(kernel: Kernel, chosen: Variant, err: Exception, folder: Path) -> Outcome | None:
    """Where the compiler refused `chosen` (e.g. gcc before 11 has no -mamx-tile or -mavxvnni) and
    `kernel` has a variant below it, that variant loaded (the next one down that the CPU has; its own
    failures silent), else None."""
    below = [v for v in offered(kernel) if variants.rank(v.level) < variants.rank(chosen.level)]
    if not isinstance(err, subprocess.CalledProcessError) or not below:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = load(kernel, folder, below[-1].level)
    return outcome if outcome.kernel is not None else None


POOL_KERNEL = "tile_gemv"  # the kernel whose claim pool (`flexlamps_pool_run`) every other kernel's threads share


def share_pool(library: ctypes.CDLL, folder: Path, level: str | None = None) -> None:
    """Hands a kernel library that splits its work over threads (`flexlamps_use_pool`, pool_hook.h)
    the claim pool of POOL_KERNEL's variant for `level` (the same library, so the same workers, as
    that kernel's): one set of workers for every kernel of a step, where each OpenMP team beside the
    pool kept a spinning thread on a core the pool's workers needed."""
    use = getattr(library, "flexlamps_use_pool", None)
    if use is None:
        return
    spec = kernel_spec(POOL_KERNEL)
    cap = level if level is not None else variants.process_level()
    variant = variants.best(offered(spec), cap, build.cpu_flags()) if cap is not None else None
    if variant is None:
        return  # (no kernel runs below the baseline: nothing to share)
    try:
        pool = build.built_library(spec.source, variant.compile_flags, folder)
    except subprocess.CalledProcessError:  # the compiler refused it: the variant below, as `load` falls back
        below = [v for v in offered(spec) if variants.rank(v.level) < variants.rank(variant.level)]
        if not below:
            raise
        return share_pool(library, folder, below[-1].level)
    use.argtypes, use.restype = [ctypes.c_void_p], None
    use(ctypes.cast(pool.flexlamps_pool_run, ctypes.c_void_p))


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
    """The kernels one process runs, each loaded on first use from `folder` (thread-safe), in
    their variants at or below `level` (None: the process's level, `variants.process_level`)."""

    def __init__(self, folder: Path, level: str | None = None):
        self.folder, self.level = Path(folder), level
        self._outcomes: dict[str, Outcome] = {}
        self._lock = threading.Lock()

    def outcome(self, name: str) -> Outcome:
        known = self._outcomes.get(name)  # loaded once, then read without the lock (every decode product asks)
        if known is not None:
            return known
        with self._lock:
            if name not in self._outcomes:
                self._outcomes[name] = load(kernel_spec(name), self.folder, self.level)
            return self._outcomes[name]

    def get(self, name: str) -> Any:
        """The loaded kernel `name`, or None where torch's runs instead."""
        return self.outcome(name).kernel


@functools.lru_cache(maxsize=None)
def chosen() -> Kernels:
    """This process's kernels, built into the cache folder's `kernels/`."""
    return Kernels(cache_root() / "kernels")
