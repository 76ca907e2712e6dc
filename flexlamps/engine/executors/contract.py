"""The executor contract: what the batch face (generate, score) and the augmented face (the
scheduler's iterations) may ask of an executor, and all they may ask.

An executor owns the model's weights wherever they live (all in memory, or spread over
gpu / cpu / disk by a placement policy) and runs forward sweeps over a KV cache it created:

    cache = executor.new_cache(num_slots, capacity)          # one dense row per sequence
    pool = executor.new_paged_cache(gpu_blocks, cpu_blocks, block_size)  # blocks + swap pool
    logits = executor.forward_steps(cache, [Step(...), ...])  # prefill chunks and decodes of any rows
    cache.release()                                         # its bytes go back to the tiers
    executor.tier_use()                                     # bytes in use and peak, per tier

Freeing rows: a dense row is reused by writing its new sequence from position 0 (attention
never reads past a row's own positions); a paged cache's blocks are freed with
`free_blocks` and its blocks move between tiers with `swap_out` / `swap_in`, as the
scheduler's BlockManager decides. Every executor's results are the in-memory executor's
(exactly, or within the stated error of a compressed policy), whatever the mix of steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from flexlamps.engine.executors.step import Step
from flexlamps.models.config import ModelConfig


@dataclass(frozen=True, slots=True)
class TierUse:
    """One tier's bytes: in use now, the most in use at once, and the budget (None: unbounded)."""
    used_bytes: int
    peak_bytes: int
    capacity_bytes: int | None


@runtime_checkable
class KVCache(Protocol):
    """A cache the models attend through: `attend_fn(layer, slots, positions)` returns the
    `attend(q, k, v, opts=None)` callback of one layer of one step (see blocks.decoder.Attend).
    What a face may do with its rows, the cache says (the batch face packs and rewinds scoring rows)."""

    packs_rows: bool  # accepts packed steps: several sequences in one row (see executors.step.Step)
    rewinds: bool  # a row may be fed again from an earlier position (a recurrent state cannot)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor): ...

    def release(self) -> None:
        """Hand the cache's bytes back to the tier budgets they were charged to."""


@runtime_checkable
class PagedCache(KVCache, Protocol):
    """Fixed-size blocks on the gpu tier plus a swap pool on the cpu tier (PagedAttention)."""
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    device: torch.device
    block_bytes: int

    def set_block_tables(self, tables: Sequence[Sequence[int]]) -> torch.Tensor: ...

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None: ...

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None: ...

    def free_blocks(self, gpu_blocks: Sequence[int] = ()) -> None: ...


@runtime_checkable
class Executor(Protocol):
    cfg: ModelConfig
    dtype: torch.dtype
    device: torch.device

    def new_cache(self, num_slots: int, capacity: int) -> KVCache:
        """A dense cache of `num_slots` rows of `capacity` positions, on the tiers the policy gives it."""

    def new_paged_cache(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> PagedCache:
        """A paged cache whose pools are charged to this executor's gpu and cpu tiers."""

    def forward_steps(self, cache: KVCache, steps: list[Step]) -> list[torch.Tensor]:
        """One sweep over the model for every step; fp32 logits per step, (n, T or 1, vocab)."""

    def tier_use(self) -> dict[str, TierUse]:
        """Bytes per tier ("gpu", "cpu") as charged so far."""

    def planned_sweep_gpu_bytes(self, step_shapes: Sequence[tuple[int, int, int]]) -> int:
        """The gpu tier's bytes one sweep over steps of these (rows, tokens, context) shapes stages
        at worst, as the placement charges them: what a face keeps free beside its pools (0 where
        nothing is staged: all weights resident)."""

    def reset_peaks(self) -> None:
        """Start each tier's peak anew from its bytes in use (to measure one phase of a run)."""

    def close(self) -> None:
        """Stop worker threads and let go of files; the executor is not used again."""
