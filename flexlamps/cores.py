"""The cores this process may run on, and how many of them other processes leave free. No torch:
the commands' thread count (`commands.options.set_threads`) reads it before torch loads, and the
machine profile's load check (`hardware.cache`) reads it too."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def free_cores() -> int:
    """CPU cores not already busy: the cores we may run on minus the 1-minute load average
    (other processes' runnable threads), at least 1. torch's default (every core) makes its
    threads wait on each other when another process holds some cores."""
    cores = usable_cores()
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))
