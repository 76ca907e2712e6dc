"""One layer's pool of hot latent records on the gpu tier, per slot, evicted least recently used.

Each slot holds `pool_entries` records. Bookkeeping per slot: which position each pool entry
holds, the step each entry was last used, and, per position, the pool entry holding it (-1
when not pooled). A step's lookup stamps its hits, picks victims among the entries not used
this step (least recent first, lower entry on ties, so runs are reproducible), and returns
the positions to copy in and the entries to put them in; the cache does the copying, all
slots' misses in one batched gather. Every operation works on all of a step's rows at once.
"""

from __future__ import annotations

import torch


class PoolTooSmallError(ValueError):
    pass


class LatentPool:
    def __init__(self, num_slots: int, capacity: int, pool_entries: int, record_len: int,
                 storage_dtype: torch.dtype, device: torch.device):
        self.pool_entries = pool_entries
        self.records = torch.zeros((num_slots, pool_entries, record_len), dtype=storage_dtype, device=device)
        self.position = torch.full((num_slots, pool_entries), -1, dtype=torch.long, device=device)
        self.stamp = torch.full((num_slots, pool_entries), -1, dtype=torch.long, device=device)
        self.entry_of = torch.full((num_slots, capacity), -1, dtype=torch.long, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.records, self.position, self.stamp, self.entry_of))

    @staticmethod
    def bytes_for(num_slots: int, capacity: int, pool_entries: int, record_bytes: int) -> int:
        """`nbytes` of a pool of these sizes, allocating nothing: the records, then int64
        position and stamp per entry and the entry of each position."""
        return num_slots * (pool_entries * (record_bytes + 16) + capacity * 8)

    def reset(self, slot: int) -> None:
        """Forget a slot's entries (a new sequence takes the slot)."""
        self.position[slot] = -1
        self.stamp[slot] = -1
        self.entry_of[slot] = -1

    def admit(self, slots: torch.Tensor, positions: torch.Tensor, wanted: torch.Tensor,
              now: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Make the `wanted` entries of `positions` (n, k; distinct within a row) resident in the
        pools of `slots` (n,) at step `now`, all rows at once.

        Returns (slot, position, pool entry) of every record to copy in, as three 1-D tensors;
        the caller copies them. Raises PoolTooSmallError if a pool cannot hold its row's set.
        """
        rows = slots[:, None].expand_as(positions)
        entries = self.entry_of[rows, positions]
        hit = wanted & (entries >= 0)
        self.stamp[rows[hit], entries[hit]] = now
        missing = wanted & (entries < 0)
        miss_slots, miss_pos = rows[missing], positions[missing]  # row-major: grouped by row
        victim_slots, victims = self._victims(slots, missing.sum(1), now)
        self._place(victim_slots, victims, miss_pos, now)
        return miss_slots, miss_pos, victims

    def offer(self, slots: torch.Tensor, positions: torch.Tensor, now: int) -> tuple[torch.Tensor, ...]:
        """Pool new tokens (already on the device: no copy) into entries not used at step `now`,
        as many as there are. Returns (slot, position, entry) of those pooled."""
        rows = slots[:, None].expand_as(positions)
        fresh = self.entry_of[rows, positions] < 0
        victim_slots, victims = self._victims(slots, fresh.sum(1), now, partial=True)
        # keep each row's first positions, as many as it got entries
        rank = fresh.long().cumsum(1) - 1
        got = torch.bincount(victim_slots, minlength=self.entry_of.shape[0])[slots]
        fresh &= rank < got[:, None]
        self._place(victim_slots, victims, positions[fresh], now)
        return rows[fresh], positions[fresh], victims

    def _place(self, slots: torch.Tensor, entries: torch.Tensor, positions: torch.Tensor, now: int) -> None:
        old = self.position[slots, entries]
        held = old >= 0
        self.entry_of[slots[held], old[held]] = -1
        self.position[slots, entries] = positions
        self.entry_of[slots, positions] = entries
        self.stamp[slots, entries] = now

    def _victims(self, slots: torch.Tensor, counts: torch.Tensor, now: int,
                 partial: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, `counts` entries not used at step `now`, least recently used first (lower
        entry on ties); (slot, entry) pairs grouped by row in `slots` order."""
        stamps = self.stamp[slots]  # (n, P)
        order = torch.sort(stamps, dim=1, stable=True).indices
        free = torch.gather(stamps, 1, order) < now
        available = free.sum(1)
        if not partial and bool((available < counts).any()):
            raise PoolTooSmallError(f"a pool of {self.pool_entries} entries cannot hold the {int(counts.max())} "
                                    "entries one step needs besides those it already uses; give each layer's "
                                    "pool at least one step's working set (index_topk entries)")
        take = free & (free.long().cumsum(1) <= torch.minimum(counts, available)[:, None])
        return slots[:, None].expand_as(order)[take], order[take]

    def entries(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Pool entry of each of `positions` (n, k) in its row's slot; -1 where not pooled."""
        return self.entry_of[slots[:, None].expand_as(positions), positions]
