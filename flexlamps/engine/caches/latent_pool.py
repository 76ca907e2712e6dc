"""One layer's pool of hot latent records on the gpu tier, per slot, evicted least recently used.

Each slot holds `pool_entries` records. Bookkeeping per slot: which position each pool entry
holds, the step each entry was last used, and, per position, the pool entry holding it (-1
when not pooled). A step's lookup stamps its hits, picks victims among the entries not used
this step (least recent first, lower entry on ties, so runs are reproducible), and returns
the positions to copy in and the entries to put them in; the cache does the copying, all
slots' misses in one batched gather.
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

    def reset(self, slot: int) -> None:
        """Forget a slot's entries (a new sequence takes the slot)."""
        self.position[slot] = -1
        self.stamp[slot] = -1
        self.entry_of[slot] = -1

    def admit(self, slot: int, positions: torch.Tensor, now: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Make `positions` (1-D, distinct) resident in `slot`'s pool at step `now`.

        Returns (missing positions, the pool entries they go to); the caller copies their
        records in. Raises PoolTooSmallError if the pool cannot hold them together.
        """
        entries = self.entry_of[slot, positions]
        hit = entries >= 0
        self.stamp[slot, entries[hit]] = now
        missing = positions[~hit]
        victims = self._victims(slot, missing.numel(), now)
        old = self.position[slot, victims]
        self.entry_of[slot, old[old >= 0]] = -1
        self.position[slot, victims] = missing
        self.entry_of[slot, missing] = victims
        self.stamp[slot, victims] = now
        return missing, victims

    def offer(self, slot: int, positions: torch.Tensor, now: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pool as many of `positions` as there are entries not used at step `now` (new tokens,
        already on the device: pooling them costs no copy). Returns (positions, entries)."""
        fresh = positions[self.entry_of[slot, positions] < 0]
        victims = self._victims(slot, fresh.numel(), now, partial=True)
        fresh = fresh[:victims.numel()]
        old = self.position[slot, victims]
        self.entry_of[slot, old[old >= 0]] = -1
        self.position[slot, victims] = fresh
        self.entry_of[slot, fresh] = victims
        self.stamp[slot, victims] = now
        return fresh, victims

    def _victims(self, slot: int, count: int, now: int, partial: bool = False) -> torch.Tensor:
        stamps = self.stamp[slot]
        order = torch.sort(stamps, stable=True).indices
        free = order[stamps[order] < now]
        if free.numel() < count and not partial:
            raise PoolTooSmallError(f"a pool of {self.pool_entries} entries cannot hold the {count} entries "
                                    f"one step needs besides those it already uses; give each layer's pool "
                                    f"at least one step's working set (index_topk entries)")
        return free[:count]

    def entries(self, slot: int, positions: torch.Tensor) -> torch.Tensor:
        return self.entry_of[slot, positions]
