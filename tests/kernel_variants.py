"""Every instruction-set variant of a native kernel as a test parameter: each runs where the CPU
has it and is skipped, with the flags it lacks, where not (CI runs the AVX2 variant on any x86
box; an AVX-512 box runs both), or where this process cannot run it (`loader.Kernel.unfit`: torch
capped at AVX2 lays int4 tiles out for the AVX2 variants only)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flexlamps.cache_folder import cache_root
from flexlamps.kernels import build, loader


def levels(spec: loader.Kernel) -> list[str]:
    """The levels `spec` is built for, lowest first (`pytest.mark.parametrize` over them)."""
    return [v.level for v in spec.variants]


def variant_kernel(spec: loader.Kernel, level: str):
    """`spec`'s kernel in its `level` variant, built and checked; skips the test where the CPU lacks
    the variant's flags or the kernels are switched off, fails it where the variant does not load."""
    have = build.cpu_flags()
    missing = [flag for flag in spec.variant(level).cpu_flags if flag not in have]
    if missing:
        pytest.skip(f"{spec.name} {level}: this CPU lacks {' '.join(missing)}")
    if (unfit := spec.unfit(spec.variant(level))) is not None:  # (the loader runs the variant below)
        pytest.skip(f"{spec.name} {level}: {unfit}")
    # every variant is tested, also where the process prefers torch's (the int8 GEMM on AMX CPUs)
    outcome = loader.load(dataclasses.replace(spec, faster_flags=()), Path(cache_root()) / "kernels", level)
    if outcome.state == "disabled":
        pytest.skip(f"{spec.name} {level}: {outcome.why}")
    if outcome.kernel is None:
        pytest.fail(f"{spec.name} {level} did not load: {outcome.why}")
    assert outcome.variant == level
    return outcome.kernel


def assert_rows_alone_as_together(product, weights, x) -> None:
    """`product(w, x)` gives each row of x (2-d, or 3-d with one token a row) the bits it gets
    alone, for each of `weights`: alone on 1 thread, together on 2."""
    import torch

    threads = torch.get_num_threads()
    try:
        for w in weights:
            torch.set_num_threads(1)
            alone = torch.cat([product(w, x[i:i + 1]) for i in range(len(x))])
            torch.set_num_threads(2)
            assert torch.equal(product(w, x), alone)
            assert torch.equal(product(w, x.view(len(x), 1, -1)).view(len(x), -1), alone)
    finally:
        torch.set_num_threads(threads)
