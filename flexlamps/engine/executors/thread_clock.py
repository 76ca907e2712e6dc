"""The calling thread's own clock: its CPU seconds and the seconds it was ready to run but waited
for a core (Linux's `/proc/thread-self/schedstat`). A sweep's wall time less both is what it spent
blocked (page faults, reads, locks): the split that tells a plan's miss on its compute from a busy
machine's (docs/performance.md, "The 1000-prompt job's step: CPU, a core's wait, blocked")."""

from __future__ import annotations

import time

_SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_clock() -> tuple[float, float]:
    """(this thread's CPU seconds, its seconds runnable but waiting for a core) since it started;
    the wait 0.0 without schedstat. The CPU seconds are the thread's CPU clock: schedstat's own
    lags a running thread by up to a scheduler tick."""
    try:
        with open(_SCHEDSTAT) as f:
            wait_ns = f.read().split()[1]
        waited = int(wait_ns) / 1e9
    except (OSError, ValueError, IndexError):
        waited = 0.0
    return time.thread_time(), waited
