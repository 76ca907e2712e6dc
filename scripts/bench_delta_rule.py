"""The gated delta rule as the engine runs it, at a real model's DeltaNet shape, for several chunk
sizes side by side with the recurrent form: a decode step (one token per row after an open chunk,
which the engine pads to a whole chunk) and a prompt (per token). Best of --rounds, alternating.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_delta_rule.py --threads 1

Prints milliseconds and each row's ratio to the recurrent form (decode) or to chunk 64 (prompt);
the engine's chunk is models.hybrid_config.DELTA_RULE_CHUNK. The machine's limit for a decode
step: it reads and writes each row's float32 state once (--rows x value heads x 128 x 128 x 4
bytes, twice), printed as the bandwidth the recurrent form's time implies.
"""

from __future__ import annotations

import argparse
import time

import torch

from flexlamps.models.blocks.gated_deltanet import chunk_rule_with_boundaries, recurrent_gated_delta_rule
from flexlamps.models.hybrid_config import DELTA_RULE_CHUNK


def _inputs(rows: int, tokens: int, key_heads: int, value_heads: int, dim: int, gen: torch.Generator):
    q, k = (torch.randn(rows, tokens, key_heads, dim, generator=gen) for _ in range(2))
    v = torch.randn(rows, tokens, value_heads, dim, generator=gen)
    return q, k, v, -torch.rand(rows, tokens, value_heads, generator=gen), torch.rand(rows, tokens, value_heads, generator=gen)


def _best(runs: dict, rounds: int) -> dict:
    """Milliseconds per call, best of `rounds`, the candidates alternating."""
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--key-heads", type=int, default=16, help="Qwen3-Next-80B: 16 key heads")
    ap.add_argument("--value-heads", type=int, default=32, help="Qwen3-Next-80B: 32 value heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per row")
    ap.add_argument("--chunks", default="64,32,16,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    shape = (a.key_heads, a.value_heads, a.head_dim)
    state = torch.randn(a.rows, a.value_heads, a.head_dim, a.head_dim, generator=gen) * 0.01
    chunks = [int(c) for c in a.chunks.split(",")]
    one = _inputs(a.rows, 1, *shape, gen)
    decode = {"recurrent": lambda: recurrent_gated_delta_rule(*one, state)}
    keep = torch.zeros(a.rows, dtype=torch.long)  # the engine's decode: the last chunk's update skipped
    for c in chunks:
        padded = _inputs(a.rows, c, *shape, gen)
        decode[f"chunk {c}"] = lambda c=c, x=padded: chunk_rule_with_boundaries(*x, state, keep, c)
    prompt_in = _inputs(a.rows, a.prompt, *shape, gen)
    prompt = {f"chunk {c}": lambda c=c: chunk_rule_with_boundaries(*prompt_in, state, None, c) for c in chunks}
    dec, pro = _best(decode, a.rounds), _best(prompt, max(2, a.rounds // 2))
    state_bytes = 2 * state.numel() * 4
    print(f"gated delta rule, {a.rows} rows, {a.key_heads} key / {a.value_heads} value heads of {a.head_dim}, "
          f"{a.threads} thread(s); the engine's chunk: {DELTA_RULE_CHUNK}")
    print(f"decode step: recurrent {dec['recurrent']:.1f} ms (the state read and written once: "
          f"{state_bytes / dec['recurrent'] / 1e6:.1f} GB/s)")
    base = pro.get("chunk 64", min(pro.values()))
    for c in chunks:
        name = f"chunk {c}"
        print(f"{name:>9}: decode step {dec[name]:7.1f} ms ({dec[name] / dec['recurrent']:.2f}x the recurrent form)"
              f"   prompt {pro[name] / a.prompt:.3f} ms a token ({pro[name] / base:.2f}x chunk 64)")


if __name__ == "__main__":
    main()
