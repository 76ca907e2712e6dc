"""Named points where a run can be killed on purpose, so fault tests crash it at a known moment
instead of after a random delay (where a sleep lands depends on the machine's load).

`FLEXLAMPS_KILL_AT=<point>:<n>` kills the process with SIGKILL, as `kill -9` or a power cut
would, the n-th time it passes `reached("<point>")` (n defaults to 1). Unset, as always outside
the fault tests, a pass costs one environment lookup. The points, in the order a run meets them:

- `job_locked`: generate has locked --out and loaded what earlier runs finished;
- `weight_stored`: the offload executor has stored one weight on its tier (disk files included);
- `record`: generate has written one result record to `<out>.partial` and synced it;
- `finalized`: generate has written `<out>`, its `.partial` not yet removed;
- `helm_progress`: helm has appended a batch of results to a run's progress log;
- `helm_run_written`: helm has written a run folder's files, its marker not yet saying finished;
- `eval_part`: `flexlamps eval` has answered a part of lm_eval's requests and committed it to its cache.
"""

from __future__ import annotations

import os
import signal

KILL_AT = "FLEXLAMPS_KILL_AT"
POINTS = ("job_locked", "weight_stored", "record", "finalized", "helm_progress", "helm_run_written", "eval_part")

_passes: dict[str, int] = {}


def reached(point: str) -> None:
    """Count a pass through `point`; the pass $FLEXLAMPS_KILL_AT names kills this process."""
    target = os.environ.get(KILL_AT)
    if not target:
        return
    name, _, nth = target.partition(":")
    if name != point:
        return
    _passes[point] = _passes.get(point, 0) + 1
    if _passes[point] == (int(nth) if nth.isdigit() else 1):
        os.kill(os.getpid(), signal.SIGKILL)


def kill_at(point: str, nth: int = 1) -> dict[str, str]:
    """The environment entry that kills a run at the `nth` pass through `point`."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; the points are {', '.join(POINTS)}")
    return {KILL_AT: f"{point}:{nth}"}
