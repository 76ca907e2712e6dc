"""Sliding-window layers keep only their last `window` positions: a ring in each cache row.

A window layer's query at position p sees keys p-window+1..p (blocks.attention), so its cache row
needs only the last `window` positions written to it: position P lives at ring slot P % window,
and a sequence's bytes in that layer stop growing once it passes the window (the planner charges
the same: `placement.ModelSpec.held_tokens`). A layer whose window is not shorter than the
cache's capacity keeps its row whole; so does a compressed layer (quant.kv_rows groups keys over
consecutive tokens).

Results are those of the whole row, bit for bit. A step's keys for a row are gathered into a
buffer that starts at the multiple of KEY_BLOCK at or before the row's first visible key, in
position order, the step's own keys (as computed) after the ring's. The exact attention sums
each KEY_BLOCK of keys as one product and adds the blocks in key order, and its softmax adds a
row's scores lane by lane, so the keys sit in the same blocks and lanes as in the whole row, and
the blocks left out (every key masked) added exactly 0 there.

The buffer is a copy (one row copy per key, K and V): past the window a decode step copies its
window where the whole row was read in place, its price for bytes that stop growing
(scripts/bench_window_cache.py measures both side by side).

The ring is read before the step writes it (a prompt chunk longer than the window would
overwrite keys its first queries see), and each row writes only its last `window` real tokens.
`RingRows` records how far each row was written, once per step: a step may continue a row,
start it anew from position 0, or go back only as far as the ring still holds what it sees;
anything else raises rather than read overwritten keys.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from flexlamps.models.blocks.attention import KEY_BLOCK
from flexlamps.models.config import ModelConfig


def ring_length(window: int | None, capacity: int) -> int | None:
    """The ring a layer with `window` keeps in rows of `capacity` positions; None: the whole row."""
    return window if window is not None and window < capacity else None


def layer_rings(cfg: ModelConfig, capacity: int, compressed: bool = False) -> list[int | None]:
    """Each layer's ring (`ring_length`); none in a compressed cache."""
    return [None if compressed else ring_length(cfg.attention.layer_window(i), capacity)
            for i in range(cfg.num_layers)]


def paged_ring_blocks(cfg: ModelConfig, block_size: int) -> int | None:
    """Blocks a request keeps in a paged cache when every layer slides: a ring of whole blocks that
    holds the longest window; None when some layer attends over the whole context (it needs every
    block: the blocks are shared by all layers)."""
    windows = [cfg.attention.layer_window(i) for i in range(cfg.num_layers)]
    if cfg.hybrid is not None or any(w is None for w in windows):
        return None
    return -(-max(windows) // block_size)


def may_ring(cfg: ModelConfig) -> bool:
    """Whether some layer of the model slides, so a long enough cache rings it (its rows can then
    neither hold packed sequences nor be fed again from far back)."""
    return cfg.attention.window is not None


@dataclass(frozen=True)
class RingStep:
    """One step's reads and writes of the ring layers of one window.

    A row's attention buffer (n, L) holds at `own_cols` (n, T) the step's own keys, elsewhere the
    row's ring at slot `ring_at` (n, L) (those after the step's keys, or before the window, are
    masked); `mask` (n, T, L): which keys each query sees; the step's tokens (`write_rows`,
    `write_tokens`) each ring slot `write_slots` receives."""
    ring_at: torch.Tensor
    own_cols: torch.Tensor
    mask: torch.Tensor
    write_rows: torch.Tensor
    write_tokens: torch.Tensor
    write_slots: torch.Tensor

    def to(self, device) -> "RingStep":
        return RingStep(*(getattr(self, f.name).to(device) for f in fields(self)))


def ring_step(positions: torch.Tensor, window: int, lengths: torch.Tensor | None = None,
              ring: int | None = None) -> RingStep:
    """`RingStep` of rows at `positions` (n, T), each consecutive from its first; `lengths` (n,):
    each row's real tokens (the rest padding, never written); `ring`: the ring's length when not the
    window (a paged cache's ring of whole blocks)."""
    ring = ring or window
    n, t = positions.shape
    start = positions[:, 0]
    low = (start - window + 1).clamp(min=0) // KEY_BLOCK * KEY_BLOCK  # the buffer's first position
    width = int((start + t - low).max())
    keys = low[:, None] + torch.arange(width, device=positions.device)  # (n, L) each key's position
    seen_to = positions[:, :, None]
    mask = (keys[:, None, :] <= seen_to) & (keys[:, None, :] > seen_to - window)
    real = torch.full((n,), t, device=positions.device) if lengths is None else lengths.to(positions.device)
    token = torch.arange(t, device=positions.device)[None, :]
    rows, tokens = ((token < real[:, None]) & (token >= real[:, None] - ring)).nonzero(as_tuple=True)
    own_cols = (start - low)[:, None] + torch.arange(t, device=positions.device)
    return RingStep(keys % ring, own_cols, mask, rows, tokens, positions[rows, tokens] % ring)


def ring_keys(source: torch.Tensor, index: torch.Tensor, fresh: torch.Tensor, step: RingStep) -> torch.Tensor:
    """The attention buffer (n, kv_heads, L, d): rows `index` (n, kv_heads, L) of `source` (a cache
    layer viewed as (entries, d): `ring_index`), with the step's own `fresh` (n, T, kv_heads, d) at
    `step.own_cols`. One row copy per key (an index along the ring dim copies element by element,
    10x slower)."""
    n, kv, width = index.shape
    keys = source.index_select(0, index.reshape(-1)).view(n, kv, width, source.shape[-1])
    rows = torch.arange(n, device=keys.device)[:, None].expand_as(step.own_cols)
    keys[rows, :, step.own_cols] = fresh.to(keys.device, keys.dtype)
    return keys


def ring_index(rows: torch.Tensor, offsets: torch.Tensor, length: int, kv_heads: int) -> torch.Tensor:
    """Entries (n, kv_heads, L) of a layer (rows, kv_heads, length, d) viewed as (entries, d) at
    `offsets` (n, L) of `rows`, (n,) or (n, L): a dense ring's row slots and ring slots, or a paged
    cache's blocks and offsets in them."""
    heads = torch.arange(kv_heads, device=offsets.device)[None, :, None]
    rows = rows[:, None, None] if rows.dim() == 1 else rows[:, None, :]
    return (rows * kv_heads + heads) * length + offsets[:, None, :]


def write_ring(ring: torch.Tensor, slots: torch.Tensor, fresh: torch.Tensor, step: RingStep) -> None:
    """Each row's last `window` real tokens of `fresh` (n, T, kv_heads, d) into its ring slots."""
    new = fresh[step.write_rows, step.write_tokens].to(ring.device, ring.dtype)  # (m, kv_heads, d)
    ring[slots[step.write_rows], :, step.write_slots] = new


def copy_ring_prefix(dst: torch.Tensor, dst_ring: int | None, src: torch.Tensor, src_ring: int | None,
                     length: int, slots: torch.Tensor) -> None:
    """Positions up to `length` of src's row 0 into rows `slots` of dst (one layer's K or V, either a
    ring or a whole row): a ring takes the last of them it holds."""
    keep = length if dst_ring is None else min(length, dst_ring)
    positions = torch.arange(length - keep, length)
    src_at = positions if src_ring is None else positions % src_ring
    dst_at = positions if dst_ring is None else positions % dst_ring
    rows = src[0][:, src_at.to(src.device)].transpose(0, 1)  # (keep, kv_heads, d)
    dst[slots.to(dst.device)[:, None], :, dst_at.to(dst.device)[None, :]] = rows.to(dst.device, dst.dtype)


def refuse_packed(segments) -> None:
    """A packed row (several sequences, executors.step.Segments) cannot share a ring."""
    if segments is not None:
        raise ValueError("a cache with sliding-window rings cannot take packed rows (several sequences in one "
                         "row); score such models one sequence a row")


class RingRows:
    """How far each row of a cache with ring layers was written (`held`, on the CPU)."""

    def __init__(self, num_slots: int, rings: list[int | None]):
        self.held = torch.zeros(num_slots, dtype=torch.long)
        self.shortest = min((r for r in rings if r is not None), default=None)

    @property
    def active(self) -> bool:
        return self.shortest is not None

    def begin_step(self, slots: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor | None) -> None:
        """Check that each row's step continues it, starts it anew, or goes back no further than its
        rings still hold what the step's first query sees; record how far it is written after it.
        Once per step, before its layers."""
        pos, slots = positions.cpu(), slots.cpu()
        start, t = pos[:, 0], pos.shape[1]
        if not bool((pos == start[:, None] + torch.arange(t)).all()):
            raise ValueError("a cache with sliding-window rings takes each row's positions consecutive")
        held, ring = self.held[slots], self.shortest
        sees_from = (start - ring + 1).clamp(min=0)
        bad = (start != 0) & ((start > held) | (sees_from < held - ring))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"cache row {int(slots[i])} holds positions up to {int(held[i])} in rings of "
                             f"{ring}; a step from position {int(start[i])} would read positions the ring no "
                             "longer holds (feed the row again from position 0)")
        fed = torch.full_like(start, t) if lengths is None else lengths.cpu().to(torch.long)
        self.held[slots] = start + fed

    def copied(self, slots: torch.Tensor, length: int) -> None:
        """Rows `slots` now hold a copied prefix of `length` positions."""
        self.held[slots.cpu()] = length

    def check_source(self, length: int, keep: int) -> None:
        """That row 0 (a prefix's cache) still holds the last `keep` of its first `length` positions."""
        if not self.active:
            return
        held = int(self.held[0])
        if held < length or length - keep < held - self.shortest:
            raise ValueError(f"a prefix cache holds positions up to {held} in rings of {self.shortest}; it cannot "
                             f"give positions {length - keep}..{length - 1} of a prefix of {length}")
