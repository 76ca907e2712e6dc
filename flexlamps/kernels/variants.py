"""The instruction-set levels a kernel is built for, and the one this process runs at.

Every kernel's C source compiles once per level it has (`Variant`: the level, the CPU flags it
needs, the compiler flags that build it); the C code picks its paths from the compiler's macros
(`__AVX512F__`, `__AVXVNNI__`), so a level is a set of flags, never a copy of the source. The
process's level is the best the CPU has (`LEVELS`, lowest first), or $FLEXLAMPS_CPU_VARIANT
(`VARIANT_ENV`), refused in one line where the CPU lacks it; each kernel then runs its best
variant at or below that level that the CPU has. A CPU below AVX2 + FMA + F16C (or not x86)
runs torch's kernels. Imports nothing of torch (the CLI checks the override before loading any).
"""
from __future__ import annotations

import dataclasses
import os

from flexlamps.kernels import build

VARIANT_ENV = "FLEXLAMPS_CPU_VARIANT"  # cap the kernels at this level: any box runs every level it has
COMMON_FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp")
# level -> (the CPU flags it needs, /proc/cpuinfo's names; the compiler flags that target it), lowest first
LEVELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx2": (("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),
    "avx_vnni": (("avx2", "fma", "f16c", "avx_vnni"), ("-mavx2", "-mfma", "-mf16c", "-mavxvnni")),
    "avx512": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"),
               ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c")),
    "amx": (("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c", "amx_tile", "amx_int8"),
            ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c", "-mamx-tile", "-mamx-int8")),
}
BELOW_BASELINE = "this CPU lacks AVX2 + FMA + F16C (or is not x86-64): torch's kernels run"


class VariantRefused(ValueError):
    """$FLEXLAMPS_CPU_VARIANT names a level this CPU lacks, or none at all."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One build of a kernel: its level, the CPU flags it needs and the compiler flags."""
    level: str
    cpu_flags: tuple[str, ...]
    compile_flags: tuple[str, ...]


def variant(level: str, cpu_flags: tuple[str, ...] = (), compile_flags: tuple[str, ...] = ()) -> Variant:
    """The build at `level`, needing `cpu_flags` and compiled with `compile_flags` beyond the level's."""
    need, flags = LEVELS[level]
    return Variant(level, need + tuple(f for f in cpu_flags if f not in need), COMMON_FLAGS + flags + compile_flags)


def rank(level: str) -> int:
    return list(LEVELS).index(level)


def cpu_levels(have: list[str] | None = None) -> list[str]:
    """The levels this CPU has, lowest first (none below AVX2 or off x86)."""
    have = build.cpu_flags() if have is None else have
    return [level for level, (need, _) in LEVELS.items() if all(flag in have for flag in need)]


def process_level(have: list[str] | None = None) -> str | None:
    """The level this process's kernels run at: $FLEXLAMPS_CPU_VARIANT, else the CPU's best; None
    below AVX2. Raises VariantRefused for a level the CPU lacks or that does not exist."""
    levels = cpu_levels(have)
    wanted = os.environ.get(VARIANT_ENV, "").strip().lower()
    if not wanted:
        return levels[-1] if levels else None
    if wanted not in LEVELS:
        raise VariantRefused(f"${VARIANT_ENV}={wanted}: no such CPU variant; use one of {', '.join(LEVELS)} "
                             f"(this CPU has {', '.join(levels) or 'none'}) or unset it")
    if wanted not in levels:
        have = build.cpu_flags() if have is None else have
        missing = [flag for flag in LEVELS[wanted][0] if flag not in have]
        raise VariantRefused(f"${VARIANT_ENV}={wanted}: this CPU lacks {' '.join(missing)}; use one of "
                             f"{', '.join(levels) or '(none: unset it)'} or unset it")
    return wanted


def best(variants: tuple[Variant, ...], cap: str, have: list[str]) -> Variant | None:
    """The highest of `variants` at or below `cap` whose CPU flags `have` holds."""
    fits = [v for v in variants if rank(v.level) <= rank(cap) and all(flag in have for flag in v.cpu_flags)]
    return max(fits, key=lambda v: rank(v.level), default=None)
