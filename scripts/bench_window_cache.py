"""Decode attention of one sliding-window layer, a ring of the window (engine.caches.window) beside
the whole row with the window in its mask (the path before rings), side by side in one process:
bytes held per layer and seconds per decode step at contexts before and past the window.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_window_cache.py --window 4096 --contexts 1024,4096,8192

Mistral-7B's attention shape (32 heads, 8 kv heads of 128), float32, the same random keys in both;
each step's outputs are checked equal bit for bit before its time counts.
"""

from __future__ import annotations

import argparse
import time

import torch

from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.engine.caches.window import ring_step, write_ring
from flexlamps.models.blocks.attention import AttnOptions
from flexlamps.models.config import ModelConfig
from flexlamps.models.layer_config import AttentionConfig

HEADS, KV, D = 32, 8, 128


def _cfg(window: int | None, capacity: int) -> ModelConfig:
    return ModelConfig(arch="decoder", model_type="mistral", vocab_size=8, hidden_size=HEADS * D, num_layers=1,
                       num_heads=HEADS, num_kv_heads=KV, head_dim=D, intermediate_size=8, max_position=capacity,
                       attention=AttentionConfig(window=window))


def _fill(cache, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Rows holding a prompt's keys and values (n, T, kv, d), as its prefill writes them, without
    the prompt's attention (quadratic in T: minutes at 8K on one core)."""
    positions = torch.arange(k.shape[1]).expand(len(slots), -1)
    if cache.rings[0] is None:
        cache.k[0][slots, :, :k.shape[1]], cache.v[0][slots, :, :v.shape[1]] = k.transpose(1, 2), v.transpose(1, 2)
        return
    cache.ring_rows.begin_step(slots, positions, None)
    step = ring_step(positions, cache.rings[0])
    write_ring(cache.k[0], slots, k, step)
    write_ring(cache.v[0], slots, v, step)


def _decode_seconds(cache, rows: int, context: int, steps: int, opts, g) -> tuple[float, list]:
    """Fill the rows to `context`, then time `steps` decode steps."""
    slots = torch.arange(rows)
    q, k, v = (torch.randn(rows, context + steps, h, D, generator=g) for h in (HEADS, KV, KV))
    _fill(cache, slots, k[:, :context], v[:, :context])
    outs, spent = [], 0.0
    for step in range(context, context + steps):
        positions = torch.full((rows, 1), step)
        geo = cache.step_geometry(slots, positions)
        began = time.perf_counter()
        outs.append(cache.attend_fn(0, slots, positions, geometry=geo)(
            q[:, step:step + 1], k[:, step:step + 1], v[:, step:step + 1], opts))
        spent += time.perf_counter() - began
    return spent / steps, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--contexts", default="1024,4096,8192")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    opts = AttnOptions(window=args.window)
    print(f"threads {torch.get_num_threads()}, window {args.window}, {args.rows} rows, float32")
    for context in map(int, args.contexts.split(",")):
        capacity = context + args.steps + 1
        times, held, outs = {}, {}, {}
        for name, window in (("whole row", None), ("ring", args.window)):
            cache = DenseKVCache(_cfg(window, capacity), args.rows, capacity, torch.float32)
            held[name] = cache.nbytes
            times[name], outs[name] = _decode_seconds(cache, args.rows, context, args.steps, opts,
                                                      torch.Generator().manual_seed(context))
        same = all(torch.equal(a, b) for a, b in zip(outs["ring"], outs["whole row"]))
        print(f"context {context}: bytes ring/whole {held['ring'] / held['whole row']:.3f} "
              f"({held['ring'] >> 20} / {held['whole row'] >> 20} MiB); decode step "
              f"{times['ring'] * 1e3:.2f} / {times['whole row'] * 1e3:.2f} ms, ratio "
              f"{times['ring'] / times['whole row']:.2f}; outputs equal: {same}")


if __name__ == "__main__":
    main()
