"""Byte budgets per tier: enforced on every allocation, with a peak counter."""

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
        self._lock = threading.Lock()

    def allocate(self, nbytes: int, what: str) -> None:
        with self._lock:
            if self.used_bytes + nbytes > self.capacity_bytes:
                raise BudgetExceededError(self.tier, what, nbytes, self.used_bytes, self.capacity_bytes)
            self.used_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.used_bytes)

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.used_bytes -= nbytes
            assert self.used_bytes >= 0, f"{self.tier} budget freed more than it allocated"

    def reset_peak(self) -> None:
        """Start a new peak from the bytes in use now (to measure one phase of a run)."""
        with self._lock:
            self.peak_bytes = self.used_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def __repr__(self) -> str:
        return f"TierBudget({self.tier}: {_size(self.used_bytes)} used, peak {_size(self.peak_bytes)}, cap {_size(self.capacity_bytes)})"
