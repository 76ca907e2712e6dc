"""Measure the scheduler's CostModel on the real engine (before any request runs).

The policies price strategies with a CostModel (recompute time, swap time, iteration time).
The simulator's default describes GPT-J on an A100; the real engine measures its own:

    decode of 1 and of `batch` rows   -> fixed cost per iteration and cost per decoding row
    one prefill chunk of `chunk` rows  -> cost per prompt / recompute token
    one decode at a long position      -> cost per cached token attention reads
    a swap of a few blocks             -> swap bandwidth

On a CPU there is no memory-bound floor separate from the per-token costs, so the fixed cost
goes to `overhead_s` and `weights_read_s` is 0. Each timing is the best of `repeats`.
The pool's blocks are used as scratch; run this before admitting requests.
"""

from __future__ import annotations

import time

import torch

from flexlamps.engine.caches.paged_state import probing
from flexlamps.engine.executors.contract import Executor, PagedCache
from flexlamps.engine.executors.step import Step
from flexlamps.sched.cost_model import CostModel


def _best_of(fn, repeats: int, timer=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = timer()
        fn()
        best = min(best, timer() - t0)
    return best


def _forward_time(executor: Executor, cache: PagedCache, rows: int, length: int, start: int, repeats: int,
                  timer) -> float:
    bs = cache.block_size
    num_blocks = (start + length - 1) // bs + 1 + getattr(cache, "state_blocks", 0)
    blocks = list(range(num_blocks))
    slots = cache.set_block_tables([blocks] * rows)
    ids = torch.zeros((rows, length), dtype=torch.long, device=cache.device)
    pos = torch.arange(start, start + length, device=cache.device).expand(rows, length)
    last = torch.full((rows,), length - 1, dtype=torch.long, device=cache.device)
    with probing(cache):  # rows share blocks and start where no state was left: shapes only
        return _best_of(lambda: executor.forward_steps(cache, [Step(ids, pos, slots, last)]), repeats, timer)


def calibrate_cost_model(executor: Executor, cache: PagedCache, max_model_len: int, *, batch: int = 8,
                         chunk: int = 64, long_context: int = 512, repeats: int = 2,
                         timer=time.perf_counter) -> CostModel:
    """A CostModel for `executor` + `cache` on this machine (capacities from the cache).
    `timer` is the engine's clock: time.perf_counter (wall) or time.process_time (CPU)."""
    state_blocks = getattr(cache, "state_blocks", 0)  # a hybrid model's recurrent state, per request
    pool_tokens = (cache.num_gpu_blocks - state_blocks) * cache.block_size
    chunk = max(2, min(chunk, pool_tokens - 1, max_model_len - 1))
    long_context = max(2, min(long_context, pool_tokens - 1, max_model_len - 1))
    _forward_time(executor, cache, 1, 1, 0, 1, timer)  # warm-up
    dec1 = _forward_time(executor, cache, 1, 1, 0, repeats, timer)
    dec_b = _forward_time(executor, cache, batch, 1, 0, repeats, timer)
    pre = _forward_time(executor, cache, 1, chunk, 0, repeats, timer)
    far = _forward_time(executor, cache, 1, 1, long_context - 1, repeats, timer)
    per_seq = max(0.0, (dec_b - dec1) / (batch - 1))
    overhead = max(1e-6, dec1 - per_seq)
    per_token = max(1e-9, (pre - overhead) / chunk)
    kv_read = max(0.0, (far - dec1) / long_context)
    pairs = [(g, c) for g, c in zip(range(min(4, cache.num_gpu_blocks)), range(min(4, cache.num_cpu_blocks)))]
    if pairs:
        swap_s = _best_of(lambda: cache.swap_out(pairs), repeats, timer)
        swap_bps = len(pairs) * cache.block_bytes / max(swap_s, 1e-9)
    else:
        swap_bps = 1e9  # no swap space: the bandwidth is never used
    return CostModel(
        overhead_s=overhead, weights_read_s=0.0, prefill_per_token_s=per_token,
        decode_per_seq_s=per_seq, kv_read_per_token_s=kv_read, swap_bytes_per_s=swap_bps,
        kv_bytes_per_token=cache.block_bytes // cache.block_size,
        gpu_kv_tokens=pool_tokens, cpu_swap_tokens=cache.num_cpu_blocks * cache.block_size,
        state_tokens=state_blocks * cache.block_size,
        max_model_len=max_model_len, note="measured on this machine by flexlamps agents")
