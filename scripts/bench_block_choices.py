"""The measurements behind choices the model blocks make (flexlamps/models/blocks), side by side
in one process on this machine; docs/performance.md records a run.

- dense GEMM: oneDNN's linear (what `dense_gemm.dense_linear` runs in fp32) against torch's
  `F.linear` (MKL), on SmolLM2's shapes: a prompt chunk and decode batches;
- prepacked weights (`dense_gemm.pack`) against the plain layout oneDNN reorders on every call;
- the dequantization buffer reused per thread (`dense_gemm.dense_scratch`) against a fresh one of
  TinyLlama's stacked gate/up size (46 MiB in bf16; glibc returns blocks over 32 MiB to the system);
- MLA scores with the heads folded into the rows of one GEMM (`mla.latent_attention`) against the shared
  entries broadcast over the heads.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_block_choices.py [--threads 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.dense_gemm import dense_linear, dense_scratch, pack, uses_onednn

HIDDEN, FFN = 576, 1536  # SmolLM2-135M's gate/up projection (576 -> 1536)


def best_ms(fn, repeats: int) -> float:
    """The fastest of `repeats` calls, in ms (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def dense_rows(repeats: int) -> None:
    w = torch.randn(FFN, HIDDEN)
    packed = pack(w)
    if not uses_onednn(w, w):
        print("oneDNN's linear is not available here: the dense GEMM runs F.linear")
        return
    print(f"dense GEMM, fp32, {HIDDEN} -> {FFN} (ms: F.linear | oneDNN plain | oneDNN packed)")
    for rows in (1, 8, 32, 512):
        x = torch.randn(rows, HIDDEN)
        mkl = best_ms(lambda: F.linear(x, w), repeats)
        plain = best_ms(lambda: dense_linear(x, w), repeats)
        pre = best_ms(lambda: dense_linear(x, packed), repeats)
        print(f"  {rows:4d} rows: {mkl:7.3f} | {plain:7.3f} | {pre:7.3f}   F.linear / packed {mkl / pre:4.2f}x")


def scratch(repeats: int) -> None:
    shape = (2 * 5632, 2048)  # TinyLlama's stacked gate/up, 46 MiB in bf16
    src = torch.zeros(shape, dtype=torch.bfloat16)

    def fresh():
        torch.empty(shape, dtype=torch.bfloat16).copy_(src)

    def reused():
        dense_scratch(shape, torch.bfloat16, src.device).copy_(src)

    a, b = best_ms(fresh, repeats), best_ms(reused, repeats)
    print(f"writing a dequantized 46 MiB weight: fresh buffer {a:.1f} ms, reused {b:.1f} ms ({a / b:.1f}x)")


def mla_scores(repeats: int) -> None:
    rows, heads, entries, rank = 4, 16, 2048, 512 + 64  # DeepSeek-V3.2: top-2048, latent 512 + rope 64
    q = torch.randn(rows, heads, 1, rank)
    kv = torch.randn(rows, entries, rank)

    def broadcast():
        torch.matmul(q, kv.unsqueeze(1).transpose(-1, -2))  # (n, H, 1, S): entries broadcast over heads

    def folded():
        torch.bmm(q.reshape(rows, heads, rank), kv.transpose(1, 2))  # heads folded into the rows

    a, b = best_ms(broadcast, repeats), best_ms(folded, repeats)
    print(f"MLA scores, {rows} rows x {heads} heads x {entries} entries: broadcast {a:.2f} ms, folded {b:.2f} ms "
          f"({a / b:.1f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    with torch.inference_mode():
        dense_rows(args.repeats)
        scratch(args.repeats)
        mla_scores(args.repeats)


if __name__ == "__main__":
    main()
