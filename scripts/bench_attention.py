"""The attention kernel (flexlamps/kernels/attention.c) alone on the calls a batch-32 run makes, 1 thread:
SmolLM2-135M's (9 heads on 3 kv heads of 64) and TinyLlama-1.1B's (32 on 4) causal 128-token prompt
layer and decode layer (32 rows, up to 160 keys), and two other layouts (12 heads of 64 without
grouping, 16 heads of 128 on 4). Prints the best of --repeats in CPU time (this thread's, so other
load on the box moves it less than wall time), in ms a call.

`--against DIR` also builds the kernel from another copy of flexlamps/kernels (e.g. an older
commit's: `mkdir -p /tmp/old && git archive COMMIT flexlamps/kernels | tar x -C /tmp/old`, then DIR is
/tmp/old/flexlamps/kernels), checks that both give the same bits on every call and times the two in
turns in this process: their ratio is what a change to the kernel gained.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_attention.py [--repeats 10] [--against DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from flexlamps.cache_folder import cache_root
from flexlamps.kernels import attention, build, variants

# name: rows, heads, kv heads, head size, queries a row (1: a decode over up to 160 keys)
CALLS = {"smollm2 prompt": (32, 9, 3, 64, 128), "smollm2 decode": (32, 9, 3, 64, 1),
         "1.1b prompt": (8, 32, 4, 64, 128), "1.1b decode": (32, 32, 4, 64, 1),
         "12 x 64 prompt": (8, 12, 12, 64, 128), "16/4 x 128 prompt": (8, 16, 4, 128, 128)}


def kernel_from(folder: Path) -> attention.NativeAttention:
    """attention.c in `folder` built for this process's level ($FLEXLAMPS_CPU_VARIANT, else the CPU's best;
    its fp32 paths)."""
    chosen = variants.best(attention.VARIANTS, variants.process_level() or "avx2", build.cpu_flags())
    if chosen is None:
        raise SystemExit("bench_attention: this CPU lacks AVX2 + FMA + F16C, which the kernel needs")
    level, flags = chosen.level, chosen.compile_flags
    out = cache_root() / "bench_attention"
    out.mkdir(parents=True, exist_ok=True)
    return attention.NativeAttention(build.built_library(Path(folder) / "attention.c", flags, out), level=level)


def inputs(rows: int, heads: int, kv: int, d: int, t: int, gen: torch.Generator):
    """Random bf16 q, keys, values and the mask: causal for a prompt, each row's own length for a decode."""
    span = 160 if t == 1 else t
    q = torch.randn(rows, heads, t, d, generator=gen).bfloat16()
    keys, values = (torch.randn(rows, kv, span, d, generator=gen).bfloat16() for _ in range(2))
    if t == 1:
        lengths = torch.randint(100, span + 1, (rows,), generator=gen)
        return q, keys, values, torch.arange(span)[None, None, :] < lengths[:, None, None]
    return q, keys, values, (torch.arange(span)[None, :] <= torch.arange(t)[:, None]).expand(rows, t, span)


def best_times(kernels: dict, args: tuple, repeats: int) -> tuple[dict, bool]:
    """Each kernel's best CPU seconds a call, taken in turns, and whether all gave the same bits."""
    best, outs = {name: float("inf") for name in kernels}, {}
    for _ in range(repeats):
        for name, kernel in kernels.items():
            start = time.thread_time()
            outs[name] = kernel(*args)
            best[name] = min(best[name], time.thread_time() - start)
    first = next(iter(outs.values()))
    return best, all(torch.equal(first.view(torch.int16), out.view(torch.int16)) for out in outs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--against", type=Path, default=None, help="a folder holding another attention.c and its headers")
    args = ap.parse_args()
    if args.against and not (args.against / "attention.c").is_file():
        ap.error(f"--against {args.against}: no attention.c there (give a copy of flexlamps/kernels)")
    torch.set_num_threads(1)
    kernels = {"this": kernel_from(build.SOURCES)}
    if args.against:
        kernels = {"against": kernel_from(args.against), **kernels}
    gen = torch.Generator().manual_seed(0)
    print(f"attention, {kernels['this'].level}, 1 thread, best of {args.repeats} (CPU ms a call)")
    for name, shape in CALLS.items():
        best, same = best_times(kernels, inputs(*shape, gen), args.repeats)
        line = " ".join(f"{k} {v * 1e3:8.3f}" for k, v in best.items())
        ratio = f" | {best['this'] / best['against']:.2f}x, same bits: {same}" if args.against else ""
        print(f"{name:>18}: {line}{ratio}")


if __name__ == "__main__":
    main()
