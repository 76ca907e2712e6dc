"""The prompt kernel on codes (`TileGemv.prompt_product`, flexlamps/kernels/tile_gemm.h) on one
matrix at a time: the products of a TinyLlama-1.1B layer as the engine calls them (q/k/v stacked
2560 x 2048, the output 2048 x 2048, gate/up stacked 11264 x 2048, down 2048 x 5632), 4-bit codes
in groups of 32 (Q4_0; q4k: Q4_K's form as loaded) and int8 codes of Q6_K's range in groups of 16 (q6: in the
6-bit form, as loaded where our kernel runs; q6split: as the split), 128 rows
(a prompt) and 4096 (32 prompts), bf16 x. Prints the best of --repeats in CPU time (this thread's,
so other load on the box moves it less than wall time) and GFLOP/s, and for each kind and row count
the shapes together (with the default shapes: one layer's prompt products, 22 of which make the
1.1B's).

`--against DIR` also builds the kernel from another copy of flexlamps/kernels (e.g. an older
commit's: `git archive COMMIT flexlamps/kernels | tar x -C /tmp/old`, then DIR is
/tmp/old/flexlamps/kernels), checks that both give the same bits, and times the two in turns in
this process: their ratio is what a change to the kernel gained (a copy older than the 6-bit form
multiplies each weight as the split: the same bits).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_prompt_kernel.py [--rows 128,4096] [--kinds q4,q6,q6split] \\
        [--shapes 2560x2048,2048x2048,11264x2048,2048x5632] [--repeats 3] [--against DIR] [--levels avx2,avx_vnni]

`--levels` times the named variants of this copy beside it, in turns (the bits compared as with --against).
`--decode-x-bits 16` times the decode product (`TileGemv.matmul`) with x in that many bits instead, as an
output head's calls it (e.g. `--shapes 32000x2048 --kinds q6 --rows 32 --decode-x-bits 16`: a 1.1B's head
at batch 32).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import time
import weakref
from pathlib import Path

import torch

from flexlamps.cache_folder import cache_root
from flexlamps.kernels import build, loader, tile_gemv, variants
from quant.int4_tiles import tile_rows
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight


def weight(kind: str, rows: int, cols: int, gen: torch.Generator):
    """A random weight of `kind`: q4 (4-bit codes, groups of 32), q4k (the same codes with Q4_K's scales),
    q6 (int8 codes in [-32, 31], groups of 16, in the 6-bit form), q6split (the same as the split) or q6k
    (Q6_K's form, `Int8Weight.from_k6_blocks`, as loaded where our kernel runs; a kernel older than it takes
    its 6-bit form's scales, `pairs`)."""
    if kind == "q4":
        return Int4Weight.quantize(torch.randn(rows, cols, generator=gen) * 0.05, 32, torch.bfloat16).kernel_only()
    if kind == "q4k":  # Q4_K's form as loaded (`Int4Weight.k_scales`): its 8-bit x rounded per 256 inputs
        blocks, groups = cols // 256, cols // 32
        return Int4Weight.from_k_blocks(torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=gen),
                                        torch.rand(rows, blocks, generator=gen) / 64,
                                        torch.rand(rows, blocks, generator=gen) / 64,
                                        torch.randint(0, 64, (rows, groups), generator=gen),
                                        torch.randint(0, 64, (rows, groups), generator=gen), torch.bfloat16).kernel_only()
    codes = torch.randint(-32, 32, (rows, cols), dtype=torch.int8, generator=gen)
    if kind == "q6k":
        return Int8Weight.from_k6_blocks(codes, (torch.rand(rows, cols // 256, generator=gen) / 4096).half().float(),
                                         torch.randint(-128, 128, (rows, cols // 16), dtype=torch.int8, generator=gen))
    return Int8Weight.from_codes(codes, torch.rand(rows, cols // 16, generator=gen) / 64, 16, torch.bfloat16,
                                 six_bit=kind == "q6")


class BeforeSixBit:
    """A prompt kernel built from a tile_gemv.c older than the 6-bit form (its product takes no plane):
    each weight multiplied as the split (made once a weight), as the engine held it then."""

    def __init__(self, library: ctypes.CDLL, level: str):
        self.level, self._gemm, self._splits = level, library.flexlamps_tile_gemm, weakref.WeakKeyDictionary()
        self._gemm.restype = ctypes.c_int
        self._gemm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_int] * 3

    def prompt_product(self, w, x: torch.Tensor) -> torch.Tensor:
        if isinstance(w, Int8Weight):
            if w not in self._splits:
                self._splits[w] = w.as_split()
            w = self._splits[w]
        split = w.split if isinstance(w, Int8Weight) else w
        kind = tile_gemv.KIND_INT8_SPLIT if isinstance(w, Int8Weight) else tile_gemv.KIND_INT4
        out = torch.empty(x.shape[0], split.shape[0], dtype=x.dtype)
        if self._gemm(split.kernel_codes.data_ptr(), split.scale_zero.data_ptr(), x.data_ptr(), out.data_ptr(),
                      split.shape[0], x.shape[1], split.group_size, x.shape[0], tile_rows(split.shape[1]), 0, kind, 1):
            raise ValueError(f"the older prompt kernel refused {w!r}")
        return out


def kernel_from(folder: Path) -> tile_gemv.TileGemv:
    """The kernel built from `folder`'s tile_gemv.c at this process's level."""
    level = variants.process_level()
    chosen = variants.best(tile_gemv.VARIANTS, level, build.cpu_flags())
    library = build.built_library(folder / "tile_gemv.c", chosen.compile_flags, Path(cache_root()) / "kernels")
    if "KIND_INT6" not in (folder / "tile_gemv.c").read_text():
        return BeforeSixBit(library, chosen.level)
    kernel = tile_gemv.TileGemv(library, chosen.level)
    kernel.takes_k6 = "KIND_INT6_K" in (folder / "tile_gemv.c").read_text()  # (else a q6k weight's `pairs`)
    return kernel


def level_kernel(level: str) -> tile_gemv.TileGemv:
    """This copy's kernel in its `level` variant (`--levels`: variants timed side by side)."""
    outcome = loader.load(tile_gemv.KERNEL, Path(cache_root()) / "kernels", level)
    if outcome.kernel is None:
        raise SystemExit(f"--levels {level}: {outcome.why}")
    return outcome.kernel


def best_seconds(fn, repeats: int, calls: int) -> float:
    """The fastest of `repeats` runs of `calls` calls, per call, in this thread's CPU time."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best


def time_kernels(kernels: dict, w, x: torch.Tensor, repeats: int, x_bits: int | None = None) -> tuple[dict, bool]:
    """Each kernel's best seconds a call of x @ w.T (the kernels in turns, so load hits them alike),
    and whether they all give the same bits; x_bits: the decode product's, x in that many bits."""
    if x_bits:
        w = dataclasses.replace(w, x_bits=x_bits)
    older = w.pairs() if isinstance(w, Int8Weight) and w.k_scales else w  # (Q6_K's form's, for an older kernel)
    form = {id(k): w if getattr(k, "takes_k6", True) else older for k in kernels.values()}
    call = (lambda k: k.matmul(form[id(k)], x)) if x_bits else (lambda k: k.prompt_product(form[id(k)], x))
    results = [call(k) for k in kernels.values()]
    same = all(torch.equal(r.view(torch.int16), results[0].view(torch.int16)) for r in results)
    calls = max(1, int(1e9 / (x.shape[0] * w.shape[0] * w.shape[1])))
    times = {}
    for _ in range(repeats):
        for name, k in kernels.items():
            t = best_seconds(lambda: call(k), 1, calls)
            times[name] = min(times.get(name, t), t)
    return times, same


def report(label: str, flops: float, times: dict, same: bool) -> None:
    line = " | ".join(f"{name} {t * 1e3:8.2f} ms {flops / t / 1e9:5.1f} GFLOP/s" for name, t in times.items())
    ratio = (f" | {times['against'] / times['this']:.2f}x, same bits: {same}" if "against" in times
             else f" | same bits: {same}" if len(times) > 1 else "")
    print(f"{label}: {line}{ratio}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="128,4096")
    ap.add_argument("--kinds", default="q4,q6")
    ap.add_argument("--shapes", default="2560x2048,2048x2048,11264x2048,2048x5632", help="out x in, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--against", type=Path, default=None, help="a folder holding another tile_gemv.c and its headers")
    ap.add_argument("--levels", default=None,
                    help="comma-separated variants (e.g. avx2,avx_vnni), each timed in turns against 'this' (the process's)")
    ap.add_argument("--decode-x-bits", type=int, default=None, help="time the decode product, x in 8 or 16 bits")
    args = ap.parse_args()
    torch.set_num_threads(1)
    kernels = {"this": kernel_from(tile_gemv.SOURCE.parent)}
    if args.against:
        kernels = {"against": kernel_from(args.against), **kernels}
    for level in args.levels.split(",") if args.levels else []:
        kernels[level] = level_kernel(level)
    print(f"prompt kernel, {kernels['this'].level} variant, 1 thread, CPU time, best of {args.repeats}")
    gen = torch.Generator().manual_seed(0)
    row_counts = [int(r) for r in args.rows.split(",")]
    for kind in args.kinds.split(","):
        totals = {rows: [0.0, {name: 0.0 for name in kernels}, True] for rows in row_counts}  # flops, seconds, same
        for shape in args.shapes.split(","):
            out_dim, in_dim = (int(v) for v in shape.split("x"))
            w = weight(kind, out_dim, in_dim, gen)
            for rows in row_counts:
                times, same = time_kernels(kernels, w, torch.randn(rows, in_dim, generator=gen).to(torch.bfloat16),
                                           args.repeats, args.decode_x_bits)
                report(f"{kind} {shape:>10} rows {rows:5d}", 2 * rows * out_dim * in_dim, times, same)
                total = totals[rows]
                total[0] += 2 * rows * out_dim * in_dim
                total[1] = {name: total[1][name] + t for name, t in times.items()}
                total[2] = total[2] and same
        for rows, (flops, seconds, same) in totals.items():
            report(f"{kind} {'all shapes':>10} rows {rows:5d}", flops, seconds, same)


if __name__ == "__main__":
    main()
