"""What augmented requests do between tokens, as the engine asks it: whether a sampled token
ends the request or pauses it for a call, and when each call returns with which tokens.

Two sources implement `Calls`:
- `TraceCalls`: a trace's scripted requests (segment lengths, call durations and returned
  ids known up front; the engine sleeps until a call is due);
- live tools (`flexlamps.agents.live.LiveCalls`): the model's own text decides, the call runs
  in a thread, its result is tokenized when it is done.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from flexlamps.sched.request import Request
from flexlamps.workloads.tokenized import TokenizedRequest, total_tokens

FINISHED = object()  # `Calls.on_token`'s verdict: the request has ended


class Calls(Protocol):
    def max_tokens(self, rid: str) -> int:
        """The longest context request `rid` can reach (its prompt, outputs and results)."""

    def on_token(self, req: Request, tokens: list[int]) -> object:
        """`tokens` (the context) just got a sampled token at its end. None: decode on;
        FINISHED: the request ends; a string: it pauses for a call of that type."""

    def start(self, req: Request, api_type: str, now: float) -> None:
        """`req` has paused at `now` for a call of `api_type` (ending its segment `req.segment_index`)."""

    def poll(self, now: float) -> list[tuple[str, list[int] | None]]:
        """Calls returned by `now`: (request id, the tokens joining its context, or None when
        the request ends with this call)."""

    @property
    def pending(self) -> int:
        """Calls in progress."""

    def wait(self, until: float | None, clock) -> None:
        """Block until a call may have returned, or the clock reaches `until` (None: no bound)."""

    def api_seconds(self, rid: str) -> float:
        """Seconds `rid` spent in its calls."""

    def num_calls(self, rid: str) -> int:
        """Calls `rid` made."""


class TraceCalls:
    """Scripted requests: segment lengths, call durations and returned ids from their specs."""

    def __init__(self, requests: list[TokenizedRequest]):
        self._reqs = {r.spec.request_id: r for r in requests}
        self._due: list[tuple[float, int, str, int]] = []  # (due time, seq, request id, segment)
        self._seq = 0

    def max_tokens(self, rid: str) -> int:
        return total_tokens(self._reqs[rid].spec)

    def on_token(self, req: Request, tokens: list[int]) -> object:
        seg = self._reqs[req.request_id].spec.segments[req.segment_index]
        if req.segment_output + 1 < seg.completion_tokens:
            return None
        return seg.api_type or FINISHED

    def start(self, req: Request, api_type: str, now: float) -> None:
        seg = self._reqs[req.request_id].spec.segments[req.segment_index]
        heapq.heappush(self._due, (now + seg.api_time, self._seq, req.request_id, req.segment_index))
        self._seq += 1

    def poll(self, now: float) -> list[tuple[str, list[int]]]:
        out = []
        while self._due and self._due[0][0] <= now:
            _, _, rid, seg_index = heapq.heappop(self._due)
            out.append((rid, list(self._reqs[rid].returned_ids[seg_index])))
        return out

    @property
    def pending(self) -> int:
        return len(self._due)

    def wait(self, until: float | None, clock) -> None:
        due = [t for t in (until, self._due[0][0] if self._due else None) if t is not None]
        clock.sleep_until(min(due))

    def api_seconds(self, rid: str) -> float:
        return self._reqs[rid].spec.api_seconds

    def num_calls(self, rid: str) -> int:
        return sum(1 for s in self._reqs[rid].spec.segments if s.api_type)
