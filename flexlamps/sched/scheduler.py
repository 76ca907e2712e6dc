"""The augmented-request scheduler: requests, token counts and block ids only (no torch).

Both the discrete-event simulator and the real engine drive it the same way:

    sched.add_request(req)                       # arrival
    out = sched.schedule(now)                    # plan one iteration -> SchedulerOutput
    ... run it (or cost it) ...
    sched.update_from_output(out, runner, now)   # tokens sampled, calls made, requests done
    sched.resume(request_id, returned_tokens, now)   # an API call returned

Like vLLM v1 there is no separate prefill or decode phase: every running request catches up
`tokens_to_compute` under one token budget per iteration (a decode is a catch-up of 1), so
recomputing a discarded cache is naturally chunked.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque

from flexlamps.sched.block_manager import BlockManager
from flexlamps.sched.config import SchedulerConfig
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.invariants import check_invariants
from flexlamps.sched.memory_pressure import MemoryPressure
from flexlamps.sched.output import RunnerOutput, SchedulerOutput
from flexlamps.sched.policies import SchedulingPolicy, PolicyContext
from flexlamps.sched.predictors import Predictor
from flexlamps.sched.request import Request, Status, Strategy
from flexlamps.sched.waiting_queue import WaitingQueue


class Scheduler(WaitingQueue, MemoryPressure):
    def __init__(self, config: SchedulerConfig, policy: SchedulingPolicy, predictor: Predictor, cost: CostModel):
        self.config, self.policy, self.predictor, self.cost = config, policy, predictor, cost
        self.bm = BlockManager(config.num_gpu_blocks, config.num_cpu_blocks, config.block_size, config.state_blocks,
                               config.max_blocks)
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting: list[Request] = []  # WAITING and SWAPPED requests
        self.paused: dict[str, Request] = {}
        self.iteration = 0
        self.step_s = cost.compute_time(0, 1, 0)  # moving average of iteration time
        self._watermark = int(config.watermark * config.num_gpu_blocks)
        self._pending: SchedulerOutput = SchedulerOutput()  # swaps / discards decided between steps
        self._recompute_left: dict[str, int] = {}
        self._ctx: PolicyContext | None = None
        self._running_sorted = False  # running kept in priority order between membership changes
        self._needs: Counter = Counter()  # admission needs (gpu blocks) of waiting requests
        self._min_need: int | None = None
        self._unsorted: list[Request] = []  # joined the queue since it was last ordered
        self._promoted: list[Request] = []  # promoted since the queue was last ordered
        self._tracks_service = type(policy).on_computed is not SchedulingPolicy.on_computed
        # requests preserved on the gpu through a call, and those of them the policy lets memory
        # pressure reclaim (all of them unless the policy reviews paused requests)
        self._preserved: dict[str, Request] = {}
        self._reclaimable: list[Request] = []
        # per-iteration starvation counter: (iteration counting began, queue stay, request)
        self._starving: deque = deque()
        self.last_steps = 1  # iterations the last output covered (fast-forwarded decode runs)
        self._now = 0.0  # latest time seen (arrivals, returns, iterations)

    # -- events from outside ---------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request {req.request_id!r} was already added; request ids must be unique")
        if self.bm.blocks_held(req.num_tokens + 1) > self.config.num_gpu_blocks - self._watermark:
            raise ValueError(
                f"request {req.request_id!r}: prompt of {req.num_tokens} tokens cannot fit the gpu "
                f"tier ({self.config.num_gpu_blocks} blocks); shorten it or give the gpu tier more memory"
            )
        self.requests[req.request_id] = req
        req.status = Status.WAITING
        self._now = max(self._now, req.arrival_time)
        self._add_waiting(req)
        self.policy.on_arrival(req, itertools.chain(self.running, self.waiting, self._unsorted,
                                                    self.paused.values()))

    def resume(self, rid: str, returned_tokens: int, now: float) -> None:
        """The API call of `rid` returned `returned_tokens` tokens that join its context."""
        req = self.paused.pop(rid)
        self._preserved.pop(rid, None)
        self._now = max(self._now, now)
        self.predictor.observe_api(req.api_type, now - req.api_start)
        req.num_tokens += returned_tokens
        req.segment_index += 1
        req.segment_output = 0
        req.rank_cache = None
        if req.strategy is Strategy.PRESERVE:
            req.status = Status.RUNNING
            self.running.append(req)
            self._running_sorted = False
            return
        if req.strategy is Strategy.SWAP:
            req.status = Status.SWAPPED
        else:
            req.status = Status.WAITING
            req.queue_time = now  # vLLM's continuation joins the tail
        self._add_waiting(req)

    def end_paused(self, rid: str, now: float) -> None:
        """The API call of `rid` returned and the request ends with it (its last call): its
        blocks on either tier are freed, nothing is recomputed."""
        req = self.paused.pop(rid)
        self._preserved.pop(rid, None)
        self._now = max(self._now, now)
        self.predictor.observe_api(req.api_type, now - req.api_start)
        self.bm.free(rid)
        self._recompute_left.pop(rid, None)
        req.status = Status.FINISHED
        del self.requests[rid]
        self.policy.on_finish(req)

    # -- planning ----------------------------------------------------------------------------
    def context(self, now: float) -> PolicyContext:
        # a hybrid model's running requests hold their states beside their contexts
        batch_ctx = sum(r.num_computed for r in self.running) + self.cost.state_tokens * len(self.running)
        budget = self.config.max_num_batched_tokens
        inflight = sum(r.num_tokens - r.num_computed for r in self.running)
        return PolicyContext(
            now=now,
            iteration=self.iteration,
            cost=self.cost,
            predictor=self.predictor,
            batch_context_tokens=batch_ctx,
            swap_budget_tokens=self.cost.swap_budget_tokens(self.step_s),
            cpu_free_tokens=self.bm.free_cpu_blocks * self.config.block_size,
            step_s=self.step_s,
            chunk_tokens=max(1, budget - inflight),
            budget_tokens=budget,
        )

    def schedule(self, now: float, max_steps: int = 1, step_limit=None) -> SchedulerOutput:
        """Plan the next iteration. `step_limit(req)` (simulator only) bounds how many decode
        steps `req` can take before something external happens to it (its call, its end)."""
        self.iteration += 1
        self._now = max(self._now, now)
        self.bm.copies_done()  # the last output was performed before this one is planned
        ctx = self._ctx = self.context(now)
        out, self._pending = self._pending, SchedulerOutput()
        out.iteration = self.iteration
        budget = self.config.max_num_batched_tokens
        block_size = self.config.block_size

        self._prepare(out, ctx)
        scheduled: list[Request] = []
        tables = self.bm.gpu_tables
        context = 0  # cached tokens attention reads this step
        i = 0
        while i < len(self.running):
            req = self.running[i]
            rid = req.request_id
            if req.num_tokens - req.num_computed == 1 and budget > 0:
                table = tables.get(rid)
                if table is not None and not self.bm.extra_blocks_needed(rid, req.num_computed + 1):
                    # fast path: a decode step that fits in the blocks it already has
                    out.decode.append(rid)
                    out.sampling.append(rid)
                    out.block_tables[rid] = table
                    scheduled.append(req)
                    context += req.num_computed + 1
                    budget -= 1
                    i += 1
                    continue
            n = min(req.tokens_to_compute, budget)
            if n <= 0:
                i += 1
                continue
            need = self.bm.extra_blocks_needed(rid, req.num_computed + n)
            if need > self.bm.free_gpu_blocks and not self._make_room(need, req, out, ctx):
                continue  # `req` itself was preempted; self.running shrank
            self._schedule_tokens(req, n, out)
            scheduled.append(req)
            context += req.num_computed + n
            budget -= n
            i += 1

        admitted = self._admit(budget, len(scheduled), out, ctx)
        scheduled.extend(admitted)
        if self.policy.starvation_counter == "pass_over":
            self._account_starvation(admitted)
        elif self._starving:
            self._promote_starved()

        out.context_tokens = context + sum(r.num_computed + out.scheduled_tokens(r.request_id)
                                           for r in admitted)
        out.swap_tokens = (len(out.swap_in) + len(out.swap_out)) * block_size
        if max_steps > 1 and out.decode and not (out.prefill or out.recompute or out.swap_in
                                                 or out.swap_out or admitted):
            out.num_steps = self._uniform_decode_steps(scheduled, max_steps, step_limit)
        return out

    def _prepare(self, out: SchedulerOutput, ctx) -> None:
        """Before the token budget is spent: order the running batch, apply the policy's
        per-iteration rule to preserved calls, let a preemptive policy swap out for a newcomer."""
        if not self._running_sorted or self.iteration % 16 == 0:
            rprio = self.policy.running_priority
            self.running.sort(key=lambda r: rprio(r, ctx))
            self._running_sorted = True
        if self._preserved and self.policy.reviews_paused:
            self._review_paused(out, ctx)
        if self.policy.preemptive and self.num_waiting and self.running:
            self._preempt_for_waiting(out, ctx)

    def _schedule_tokens(self, req: Request, n: int, out: SchedulerOutput) -> None:
        rid = req.request_id
        table = self.bm.gpu_tables.get(rid)
        if table is None or self.bm.extra_blocks_needed(rid, req.num_computed + n):
            self.bm.grow(rid, req.num_computed + n)
            table = self.bm.gpu_tables[rid]
        out.block_tables[rid] = table
        if req.tokens_to_compute == 1:
            out.decode.append(rid)
        else:
            redo = min(n, self._recompute_left.get(rid, 0))
            if redo:
                out.recompute[rid] = redo
            if n - redo:
                out.prefill[rid] = n - redo
        if n == req.tokens_to_compute:
            out.sampling.append(rid)

    def _admit(self, budget: int, num_scheduled: int, out: SchedulerOutput, ctx) -> list[Request]:
        """Admit waiting / swapped requests in priority order; stop at the first that does not
        fit (vLLM's head-of-line rule, which also keeps a promoted request from being passed)."""
        admitted: list[Request] = []
        if not self.num_waiting or budget <= 0 or num_scheduled >= self.config.max_num_seqs:
            return admitted
        # INFERCEPT's code lets newcomers take reclaimable preserved caches too
        reclaimable = self._reclaimable_blocks() if self.policy.reviews_paused else 0
        if self.min_waiting_need() > self.bm.free_gpu_blocks + reclaimable - self._watermark:
            return admitted  # nothing could fit: skip ranking the queue
        self._order_queue(ctx)
        taken = 0
        for req in self.waiting:
            if budget <= 0 or num_scheduled + len(admitted) >= self.config.max_num_seqs:
                break
            need = req.admit_need + self._watermark
            if need > self.bm.free_gpu_blocks and not (reclaimable and self._reclaim(need, out)):
                break
            if req.status is Status.SWAPPED:
                out.swap_in.extend(self.bm.swap_in(req.request_id))
            req.status = Status.RUNNING
            self.policy.on_admit(req, ctx.now)
            n = min(req.tokens_to_compute, budget)
            self._schedule_tokens(req, n, out)
            budget -= n
            admitted.append(req)
            taken += 1
        if taken:
            del self.waiting[:taken]  # admissions are a prefix of the sorted queue
            for r in admitted:
                self._needs[r.admit_need] -= 1
                if not self._needs[r.admit_need]:
                    del self._needs[r.admit_need]
                    if r.admit_need == self._min_need:
                        self._min_need = None
            self.running.extend(admitted)
            self._running_sorted = False
        return admitted

    def _uniform_decode_steps(self, scheduled: list[Request], max_steps: int, step_limit) -> int:
        """How many identical decode iterations can run before anything changes: no request
        reaches its next event, no waiting request could be admitted, no preemption needed."""
        k = max_steps
        if step_limit is not None:
            for r in scheduled:
                k = min(k, step_limit(r))
        if k <= 1:
            return 1
        free = self.bm.free_gpu_blocks
        if self.num_waiting and len(scheduled) < self.config.max_num_seqs \
                and self.min_waiting_need() <= free - self._watermark:
            return 1
        bs = self.config.block_size
        if free >= len(scheduled) * (-(-k // bs) + 1):
            return k  # even if every request opens new blocks all the way, they fit
        state = self.bm.state_blocks  # held from the first token on: decodes grow KV blocks only
        held = [(r.num_computed + 1, self.bm.num_gpu_blocks_of(r.request_id) - state) for r in scheduled]

        def extra(steps: int) -> int:
            return sum(max(0, self.bm.kv_blocks(c + steps - 1) - b) for c, b in held)

        if extra(k) <= free:
            return k
        lo, hi = 1, k  # extra(lo) <= free (this step's blocks were already allocated)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # -- closing the loop -------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, runner: RunnerOutput, now: float, step_s: float | None = None) -> None:
        self.bm.copies_done()  # `out` was performed: calls made now may swap into what it read
        k = out.num_steps
        self.iteration += k - 1  # schedule() counted one
        self.last_steps = k
        reqs = self.requests
        # most policies keep no service accounting: skip the per-request calls for them
        on_computed = self.policy.on_computed if self._tracks_service else None
        if k > 1:
            # the first step's blocks are allocated; grow for the rest
            for rid in out.decode:
                req = reqs[rid]
                if self.bm.extra_blocks_needed(rid, req.num_computed + k):
                    self.bm.grow(rid, req.num_computed + k)
        for rid in out.decode:
            reqs[rid].num_computed += k
        if on_computed is not None:
            for rid in out.decode:
                on_computed(reqs[rid], 1, k)
        for part in (out.prefill, out.recompute):
            for rid, n in part.items():
                req = reqs[rid]
                req.num_computed += n
                if part is out.recompute:
                    left = self._recompute_left[rid] - n
                    if left > 0:
                        self._recompute_left[rid] = left
                    else:
                        del self._recompute_left[rid]
                if on_computed is not None and part is out.prefill:
                    on_computed(req, n, 1)  # recomputation is not the request's service
        for rid in out.sampling:
            req = reqs[rid]
            req.num_tokens += k
            req.segment_output += k
            req.output_tokens += k
            if req.first_token_time is None:
                req.first_token_time = now
        if step_s is not None:
            self.step_s = 0.9 * self.step_s + 0.1 * step_s / k
        if runner.finished:
            for rid in runner.finished:
                self._finish(reqs[rid])
        if runner.intercepted:
            self._intercept([reqs[rid] for rid in runner.intercepted], runner.intercepted, now)

    def _finish(self, req: Request) -> None:
        self.predictor.observe_segment(req, req.segment_output, None)
        self.running.remove(req)
        self.bm.free(req.request_id)
        self._recompute_left.pop(req.request_id, None)
        req.status = Status.FINISHED
        del self.requests[req.request_id]
        self.policy.on_finish(req)

    def _intercept(self, reqs: list[Request], api_types: dict[str, str], now: float) -> None:
        removed = {r.request_id for r in reqs}
        self.running = [r for r in self.running if r.request_id not in removed]
        for req in reqs:
            req.api_type = api_types[req.request_id]
            req.api_start = now
            req.status = Status.PAUSED
            req.promoted, req.passed_over = False, 0  # LAMPS resets starvation on a call
            self.predictor.observe_segment(req, req.segment_output, req.api_type)
        ctx = self.context(now)
        choice = self.policy.choose_strategies(reqs, ctx)
        pending = self._pending
        for req in reqs:
            rid = req.request_id
            strategy = choice[rid]
            if strategy is Strategy.SWAP and not self.bm.can_swap_out(rid):
                strategy = Strategy.DISCARD  # the cpu tier is full (INFERCEPT falls back too)
            if strategy is Strategy.SWAP:
                pending.swap_out.extend(self.bm.swap_out(rid))
                pending.swapped_out.append(rid)
            elif strategy is Strategy.DISCARD:
                self._discard(req, pending)
            else:
                pending.preserved.append(rid)
                self._preserved[rid] = req
            req.strategy = strategy
            self.paused[rid] = req

    # -- checks -------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the memory accounting is inconsistent (see `invariants`)."""
        check_invariants(self)
