"""The prompt kernel on codes (`TileGemv.prompt_product`, flexlamps/kernels/tile_gemm.h) on one
matrix at a time: TinyLlama-1.1B's shapes (2048 x 2048, 5632 x 2048, 2048 x 5632), 4-bit codes in
groups of 32 (Q4_0 / Q4_K as loaded) and int8 codes of Q6_K's range in groups of 16, 128 rows (a
prompt) and 4096 (32 prompts), bf16 x. Prints the best of --repeats in CPU time (this thread's, so
other load on the box moves it less than wall time) and GFLOP/s.

`--against DIR` also builds the kernel from another copy of flexlamps/kernels (e.g. an older
commit's: `git archive COMMIT flexlamps/kernels | tar x -C /tmp/old`, then DIR is
/tmp/old/flexlamps/kernels), checks that both give the same bits, and times the two in turns in
this process: their ratio is what a change to the kernel gained.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_prompt_kernel.py [--rows 128,4096] [--kinds q4,q6] \\
        [--shapes 2048x2048,5632x2048,2048x5632] [--repeats 3] [--against DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from flexlamps.cache_folder import cache_root
from flexlamps.kernels import build, tile_gemv, variants
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight


def weight(kind: str, rows: int, cols: int, gen: torch.Generator):
    """A random weight of `kind`: q4 (4-bit codes, groups of 32) or q6 (int8 codes in [-32, 31], groups of 16)."""
    if kind == "q4":
        return Int4Weight.quantize(torch.randn(rows, cols, generator=gen) * 0.05, 32, torch.bfloat16).kernel_only()
    codes = torch.randint(-32, 32, (rows, cols), dtype=torch.int8, generator=gen)
    return Int8Weight.from_codes(codes, torch.rand(rows, cols // 16, generator=gen) / 64, 16, torch.bfloat16)


def kernel_from(folder: Path) -> tile_gemv.TileGemv:
    """The kernel built from `folder`'s tile_gemv.c at this process's level."""
    level = variants.process_level()
    chosen = variants.best(tile_gemv.VARIANTS, level, build.cpu_flags())
    library = build.built_library(folder / "tile_gemv.c", chosen.compile_flags, Path(cache_root()) / "kernels")
    return tile_gemv.TileGemv(library, chosen.level)


def best_seconds(fn, repeats: int, calls: int) -> float:
    """The fastest of `repeats` runs of `calls` calls, per call, in this thread's CPU time."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,4096")
    ap.add_argument("--kinds", default="q4,q6")
    ap.add_argument("--shapes", default="2048x2048,5632x2048,2048x5632", help="out x in, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--against", type=Path, default=None, help="a folder holding another tile_gemv.c and its headers")
    args = ap.parse_args()
    torch.set_num_threads(1)
    kernels = {"this": kernel_from(tile_gemv.SOURCE.parent)}
    if args.against:
        kernels = {"against": kernel_from(args.against), **kernels}
    print(f"prompt kernel, {kernels['this'].level} variant, 1 thread, CPU time, best of {args.repeats}")
    gen = torch.Generator().manual_seed(0)
    for kind in args.kinds.split(","):
        for shape in args.shapes.split(","):
            out_dim, in_dim = (int(v) for v in shape.split("x"))
            w = weight(kind, out_dim, in_dim, gen)
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, in_dim, generator=gen).to(torch.bfloat16)
                results = [k.prompt_product(w, x) for k in kernels.values()]
                same = all(torch.equal(r.view(torch.int16), results[0].view(torch.int16)) for r in results)
                calls = max(1, int(1e9 / (rows * out_dim * in_dim)))
                flops = 2 * rows * out_dim * in_dim
                times = {}
                for _ in range(args.repeats):  # the kernels in turns, so load hits both alike
                    for name, k in kernels.items():
                        t = best_seconds(lambda: k.prompt_product(w, x), 1, calls)
                        times[name] = min(times.get(name, t), t)
                line = " | ".join(f"{name} {t * 1e3:8.2f} ms {flops / t / 1e9:5.1f} GFLOP/s" for name, t in times.items())
                ratio = f" | {times['against'] / times['this']:.2f}x, same bits: {same}" if args.against else ""
                print(f"{kind} {shape:>9} rows {rows:5d}: {line}{ratio}", flush=True)


if __name__ == "__main__":
    main()
