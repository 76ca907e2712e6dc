"""Byte budgets per tier: enforced on every allocation, with a peak counter.

A budget may also hold a cache's bytes (`keep`): room the run does not need now, filled with
something worth keeping (recently used experts) and given back on demand: an allocation that
would not fit first asks `reclaim` to drop cached bytes. Cached bytes are not in `used_bytes`
or the peak (what the run needed), nor taken from `free_bytes`."""

from __future__ import annotations

import threading


def _size(n: int) -> str:
    """Bytes in the largest of GiB, MiB, KiB that leaves at least 1, else whole bytes (as
    placement.format_bytes; offload does not import the planner)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


class BudgetExceededError(MemoryError):
    def __init__(self, tier: str, what: str, needed: int, used: int, capacity: int):
        self.tier, self.what = tier, what
        self.shortfall_bytes = used + needed - capacity
        super().__init__(
            f"{tier} tier budget exceeded: {what} needs {_size(needed)} with {_size(used)} of {_size(capacity)} "
            f"in use ({self.shortfall_bytes} bytes short); raise the {tier} budget or lower the batch size")


class TierBudget:
    def __init__(self, tier: str, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError(f"{tier} budget must be >= 0 bytes, got {capacity_bytes}")
        self.tier = tier
        self.capacity_bytes = int(capacity_bytes)
        self.used_bytes = 0
        self.peak_bytes = 0
        self.cached_bytes = 0  # held by a cache, reclaimable (`keep`)
        self.reclaim = None  # reclaim(nbytes): a cache drops at least that many bytes if it can
        self._lock = threading.Lock()

    def allocate(self, nbytes: int, what: str, holds: bool = True) -> None:
        """Charge `nbytes` until `free`. `holds=False`: a charge that holds no memory of its own (a
        cpu-tier tensor staged as itself where the compute device is the CPU): in `used_bytes` and
        the peak like any other (the plan's charge), it fits beside what is used, not beside the
        cache's bytes, and never makes the cache give way: the bytes that exist (cached and held)
        stay within the capacity either way."""
        cached = self.cached_bytes if holds else 0
        short = self.used_bytes + cached + nbytes - self.capacity_bytes
        if short > 0 and self.reclaim is not None and holds:
            self.reclaim(short)
        with self._lock:
            cached = self.cached_bytes if holds else 0
            if self.used_bytes + cached + nbytes > self.capacity_bytes:
                raise BudgetExceededError(self.tier, what, nbytes, self.used_bytes + cached, self.capacity_bytes)
            self.used_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.used_bytes -= nbytes
            assert self.used_bytes >= 0, f"{self.tier} budget freed more than it allocated"

    def keep(self, nbytes: int) -> None:
        """Allocated bytes a cache keeps past their use: reclaimable from now on."""
        with self._lock:
            self.used_bytes -= nbytes
            self.cached_bytes += nbytes

    def take(self, nbytes: int) -> None:
        """Cached bytes in use again (a cache hit): allocated until freed or kept."""
        with self._lock:
            self.cached_bytes -= nbytes
            self.used_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def drop(self, nbytes: int) -> None:
        """Cached bytes given back."""
        with self._lock:
            self.cached_bytes -= nbytes

    def reset_peak(self) -> None:
        """Start a new peak from the bytes in use now (to measure one phase of a run)."""
        with self._lock:
            self.peak_bytes = self.used_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def __repr__(self) -> str:
        return f"TierBudget({self.tier}: {_size(self.used_bytes)} used, peak {_size(self.peak_bytes)}, cap {_size(self.capacity_bytes)})"
