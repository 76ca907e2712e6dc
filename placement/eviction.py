"""Misses of a GPU pool of latent entries over a trace of sparse-attention selections.

A trace is one layer's selections for one sequence: step t attends to the set S_t of cache
positions (the indexer's top-k). A pool of `capacity` entries sits on the GPU; a step must
bring in every entry of S_t not in the pool (a miss), then the pool keeps `capacity` of the
entries it holds. Two keep rules:
  - LRU (what ESS and the engine run): keep the most recently selected entries;
  - Belady (offline optimal, a lower bound for any rule): keep those selected again soonest.
Both work at step granularity (a whole S_t is needed at once), ties broken toward the lower
position so the counts are reproducible. Pure numpy.
"""

from __future__ import annotations

import numpy as np

_NEVER = np.iinfo(np.int64).max


def _keep(priority: np.ndarray, held: np.ndarray, capacity: int) -> np.ndarray:
    """Boolean mask of the `capacity` held entries with the highest priority (lower position wins ties)."""
    idx = np.flatnonzero(held)
    if idx.size <= capacity:
        return held
    order = np.lexsort((idx, -priority[idx]))  # priority descending, then position ascending
    keep = np.zeros_like(held)
    keep[idx[order[:capacity]]] = True
    return keep


def _misses(trace: list[np.ndarray], context: int, capacity: int, priority_of) -> np.ndarray:
    pool = np.zeros(context, dtype=bool)
    misses = np.empty(len(trace), dtype=np.int64)
    for step, selected in enumerate(trace):
        misses[step] = int((~pool[selected]).sum())
        held = pool.copy()
        held[selected] = True
        pool = _keep(priority_of(step, selected), held, capacity)
    return misses


def lru_misses(trace: list[np.ndarray], context: int, capacity: int) -> np.ndarray:
    """Misses per step of an LRU pool of `capacity` entries (positions < `context`), starting empty."""
    last_used = np.full(context, -1, dtype=np.int64)

    def priority(step: int, selected: np.ndarray) -> np.ndarray:
        last_used[selected] = step
        return last_used

    return _misses(trace, context, capacity, priority)


def next_uses(trace: list[np.ndarray], context: int) -> list[np.ndarray]:
    """For each step, the next step (after it) at which each position is selected (_NEVER if none)."""
    upcoming = np.full(context, _NEVER, dtype=np.int64)
    out = [upcoming] * len(trace)
    for step in range(len(trace) - 1, -1, -1):
        out[step] = upcoming.copy()
        upcoming[trace[step]] = step
    return out


def belady_misses(trace: list[np.ndarray], context: int, capacity: int) -> np.ndarray:
    """Misses per step of the offline-optimal pool (keeps the entries needed again soonest)."""
    upcoming = next_uses(trace, context)
    return _misses(trace, context, capacity, lambda step, selected: -upcoming[step])
