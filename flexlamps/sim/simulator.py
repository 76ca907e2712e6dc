"""Discrete-event simulator: replays RequestSpecs through the same Scheduler and policy objects
the real engine uses, pricing each iteration with a CostModel.

Events: arrivals and API returns (a heap); between them the engine runs iterations back to
back. Runs of identical decode iterations are priced in one go (Scheduler.schedule's
`num_steps`), which is what makes 10k+ requests take seconds.
"""

from __future__ import annotations

import heapq
from typing import Callable

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.output import RunnerOutput
from flexlamps.sched.policies import SchedulingPolicy
from flexlamps.sched.predictors import Predictor
from flexlamps.sched.records import RequestRecord, SimStats
from flexlamps.sched.request import Request, RequestSpec
from flexlamps.sched.scheduler import Scheduler, SchedulerConfig

_ARRIVAL, _RETURN = 0, 1
MAX_FAST_FORWARD = 4096


class Simulator:
    def __init__(self, specs: list[RequestSpec], policy: SchedulingPolicy, predictor: Predictor,
                 cost: CostModel, config: SchedulerConfig | None = None,
                 on_iteration: Callable[[Scheduler], None] | None = None):
        self.specs = {s.request_id: s for s in specs}
        if len(self.specs) != len(specs):
            raise ValueError("simulator: request ids must be unique")
        self.cost = cost
        self.config = config or SchedulerConfig.from_cost_model(cost)
        self.sched = Scheduler(self.config, policy, predictor, cost)
        self.on_iteration = on_iteration
        self.events: list = [(s.arrival_time, _ARRIVAL, i, s.request_id) for i, s in enumerate(specs)]
        heapq.heapify(self.events)
        self._seq = len(specs)
        self.records: list[RequestRecord] = []
        self.stats = SimStats()
        self._just_intercepted: list[str] = []
        self._pending_finish: list[tuple[Request, RequestSpec]] = []

    def _remaining(self, req: Request) -> int:
        seg = self.specs[req.request_id].segments[req.segment_index]
        return seg.completion_tokens - req.segment_output

    def _fire_events(self, now: float) -> None:
        sched, events = self.sched, self.events
        while events and events[0][0] <= now:
            t, kind, _, rid = heapq.heappop(events)
            spec = self.specs[rid]
            if kind == _ARRIVAL:
                sched.add_request(Request(rid, spec.arrival_time, spec.prompt_tokens,
                                          client_id=spec.client_id, kind=spec.kind))
            else:
                req = sched.paused[rid]
                seg = spec.segments[req.segment_index]
                # how the call ended up handled (a preserved cache may be dropped during it)
                self.stats.strategies[req.strategy.value] += 1
                sched.resume(rid, seg.api_tokens, t)

    def run(self) -> list[RequestRecord]:
        sched, cost, stats, events = self.sched, self.cost, self.stats, self.events
        now = 0.0
        while events or sched.running or sched.num_waiting or sched.paused:
            self._fire_events(now)
            # a decode run can only help if no event is due within the next two iterations
            soon = events and events[0][0] - now < 2 * cost.compute_time(0, len(sched.running), 0)
            out = sched.schedule(now, 1 if soon else MAX_FAST_FORWARD, self._remaining)
            stats.schedule_calls += 1
            if out.is_empty:
                if not events:
                    if sched.num_waiting or sched.running:
                        raise RuntimeError("simulator: requests remain but nothing can be scheduled "
                                           "(a request larger than the gpu tier?)")
                    break
                stats.waiting_s += max(0.0, events[0][0] - now) * sched.num_waiting
                now = max(now, events[0][0])
                continue
            k = out.num_steps
            if k > 1:
                k = self._steps_before_next_event(out, now, k)
                out.num_steps = k
                dt = cost.decode_run_time(len(out.decode), out.context_tokens, k)
            else:
                dt = cost.step_time(out.num_prefill_tokens, len(out.decode), out.context_tokens,
                                    out.swap_tokens)
            now += dt
            stats.waiting_s += dt * sched.num_waiting
            stats.iterations += k
            stats.busy_s += dt
            stats.prefill_tokens += sum(out.prefill.values())
            stats.recompute_tokens += sum(out.recompute.values())
            stats.decode_tokens += len(out.decode) * k
            stats.swap_tokens += out.swap_tokens
            stats.preemptions += len(out.preempted)
            sched.update_from_output(out, self._observe(out, k), now, dt)
            self._record_interceptions(now)
            if self.on_iteration is not None:
                self.on_iteration(sched)
        stats.end_time = now
        return self.records

    def _steps_before_next_event(self, out, now: float, k: int) -> int:
        """Stop a decode run at the first iteration that ends past the next arrival / return."""
        if not self.events:
            return k
        horizon = self.events[0][0] - now
        cost, b, ctx = self.cost, len(out.decode), out.context_tokens
        if cost.decode_run_time(b, ctx, k) <= horizon:
            return k
        lo, hi = 1, k
        while lo < hi:
            mid = (lo + hi) // 2
            if cost.decode_run_time(b, ctx, mid) >= horizon:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _observe(self, out, k: int) -> RunnerOutput:
        """What the model "did": which sampling requests reached the end of their segment."""
        runner = RunnerOutput()
        reqs = self.sched.requests
        for rid in out.sampling:
            req = reqs[rid]
            spec = self.specs[rid]
            seg = spec.segments[req.segment_index]
            if req.segment_output + k >= seg.completion_tokens:
                if seg.api_type:
                    runner.intercepted[rid] = seg.api_type
                else:
                    runner.finished.add(rid)
                    self._pending_finish.append((req, spec))  # recorded once `now` has advanced
        self._just_intercepted = list(runner.intercepted)
        return runner

    def _record_interceptions(self, now: float) -> None:
        sched = self.sched
        for rid in self._just_intercepted:
            req = sched.paused[rid]
            seg = self.specs[rid].segments[req.segment_index]
            self._seq += 1
            heapq.heappush(self.events, (now + seg.api_time, _RETURN, self._seq, rid))
        for req, spec in self._pending_finish:
            self.records.append(RequestRecord(
                request_id=req.request_id, kind=spec.kind, client_id=spec.client_id,
                arrival=spec.arrival_time, first_token=req.first_token_time, finish=now,
                output_tokens=req.output_tokens, api_seconds=spec.api_seconds,
                num_calls=sum(1 for s in spec.segments if s.api_type),
            ))
        self._pending_finish = []
