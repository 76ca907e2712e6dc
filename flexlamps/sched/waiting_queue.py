"""The scheduler's waiting queue: requests kept in the policy's priority order (sorted lazily, as
they join), each one's admission need in gpu blocks, and the starvation guards (LAMPS's iterations
spent waiting, or the times a request was passed over).

A part of `Scheduler` (its base class), working on the scheduler's state: `waiting`, `_unsorted`,
`_promoted`, `_needs` / `_min_need`, `_starving`, `iteration`, `policy`, `bm`, `_now`.
"""

from __future__ import annotations

import bisect
import itertools
from operator import attrgetter

from flexlamps.sched.policies import PolicyContext
from flexlamps.sched.request import Request, Status


class WaitingQueue:
    def _add_waiting(self, req: Request) -> None:
        """Queue `req`; it is placed in priority order when the queue is next looked at."""
        self._unsorted.append(req)
        req.sort_key = None
        req.queue_stays += 1
        req.queued_at = self._now
        if self.policy.starvation_counter == "pass_over":
            req.passed_over, req.promoted = 0, False  # counted per stay in the queue
        elif self.policy.starvation_threshold is not None and not req.promoted \
                and req.status is Status.WAITING:
            # LAMPS counts iterations spent WAITING (not swapped), from joining the queue
            req.starve_since = self.iteration
            self._starving.append((self.iteration, req.queue_stays, req))
        need = req.admit_need = self._admission_blocks(req)
        self._needs[need] += 1
        if self._min_need is not None and need < self._min_need:
            self._min_need = need

    def _admission_blocks(self, req: Request) -> int:
        held = self.bm.blocks_held
        if req.status is Status.SWAPPED:
            return self.bm.num_cpu_blocks_of(req.request_id) + held(req.num_tokens) - held(req.num_computed)
        return held(req.num_tokens)

    def min_waiting_need(self) -> int:
        if self._min_need is None:
            self._min_need = min(self._needs, default=1 << 60)
        return self._min_need

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self._unsorted)

    def waiting_requests(self) -> list[Request]:
        return self.waiting + self._unsorted

    def _order_queue(self, ctx: PolicyContext) -> None:
        prio, every = self.policy.priority, self.policy.rerank_every
        if every is not None and self.iteration % every == 0:
            # keys move (re-ranking, VTC counters): recompute them all
            self.waiting.extend(self._unsorted)
            self._unsorted.clear()
            self._promoted.clear()
            for r in self.waiting:
                r.sort_key = (not r.promoted, prio(r, ctx))
            self.waiting.sort(key=attrgetter("sort_key"))
            return
        stale = [r for r in self._promoted if r.sort_key is not None]
        self._promoted.clear()
        if stale:
            ids = {id(r) for r in stale}
            self.waiting = [r for r in self.waiting if id(r) not in ids]
        for r in itertools.chain(stale, self._unsorted):
            r.sort_key = (not r.promoted, prio(r, ctx))
            bisect.insort(self.waiting, r, key=attrgetter("sort_key"))
        self._unsorted.clear()

    def _account_starvation(self, admitted: list[Request]) -> None:
        threshold = self.policy.starvation_threshold
        if not admitted or threshold is None:
            return
        # passed over: a request that arrived later was admitted while this one waited
        latest = max(r.arrival_time for r in admitted)
        for req in itertools.chain(self.waiting, self._unsorted):
            if req.arrival_time < latest and not req.promoted:
                req.passed_over += 1
                if req.passed_over >= threshold:
                    req.promoted = True
                    self._promoted.append(req)

    def _promote_starved(self) -> None:
        """LAMPS's starvation guard: a request WAITING `starvation_threshold` iterations in one
        stay goes to the head of the queue until its next call."""
        limit = self.iteration - self.policy.starvation_threshold
        starving = self._starving
        while starving and starving[0][0] <= limit:
            _, stay, req = starving.popleft()
            if stay == req.queue_stays and req.status is Status.WAITING and not req.promoted \
                    and req.request_id in self.requests:
                req.promoted = True
                self._promoted.append(req)
