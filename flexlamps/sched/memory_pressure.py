"""How the scheduler frees gpu blocks: caches preserved through API calls are reclaimed (swapped
out or dropped), running requests are preempted (swapped, or discarded and recomputed later), and
a preemptive policy's newcomer may push out worse-ranked running requests.

A part of `Scheduler` (its base class), working on the scheduler's state: `bm` (BlockManager),
`running`, `policy`, `predictor`, `config`, `_preserved` / `_reclaimable` (caches kept through a
call, and those the policy lets memory pressure take), `_recompute_left`, `_watermark`, `_ctx`.
"""

from __future__ import annotations

from flexlamps.sched.output import SchedulerOutput
from flexlamps.sched.request import Request, Status, Strategy


class MemoryPressure:
    def _make_room(self, need: int, req: Request, out: SchedulerOutput, ctx) -> bool:
        """Free gpu blocks for `req`: first reclaim caches preserved through calls (INFERCEPT's
        passive discard), then preempt the lowest-priority running requests. Returns False if
        `req` itself had to be preempted."""
        if self._preserved:
            self._reclaim(need, out)
        while need > self.bm.free_gpu_blocks:
            victim = self.running[-1]  # running is sorted best-first
            self._preempt(victim, out, swap=self.policy.preempt_by_swap)
            if victim is req:
                return False
        return True

    def _reclaim_order(self) -> list[Request]:
        """Preserved caches memory pressure may take, the last one first: the policy's
        reclaimable ones; otherwise all, the one expected back latest taken first."""
        if self.policy.reviews_paused:
            return [r for r in self._reclaimable if self._preserved.get(r.request_id) is r]
        order = list(self._preserved.values())
        order.sort(key=lambda r: r.api_start + self.predictor.api_time(r.api_type, r))
        return order

    def _reclaimable_blocks(self) -> int:
        if not self._preserved:
            return 0
        if self.policy.reviews_paused:
            return sum(self.bm.num_gpu_blocks_of(r.request_id) for r in self._reclaim_order())
        return sum(self.bm.num_gpu_blocks_of(rid) for rid in self._preserved)

    def _reclaim(self, need: int, out: SchedulerOutput) -> bool:
        """Take preserved caches until `need` gpu blocks are free: reviewing policies swap them
        out while the cpu tier has room (INFERCEPT's `passive_discard_by_order`), others drop
        them. Returns whether `need` blocks are free."""
        victims = self._reclaim_order()
        how = self.policy.reclaim_strategy if self.policy.reviews_paused else None
        while victims and need > self.bm.free_gpu_blocks:
            victim = victims.pop()
            tokens = self._kv_tokens_held(victim.request_id)
            self._release_preserved(victim, how(tokens, self._ctx) if how else Strategy.DISCARD, out)
        return need <= self.bm.free_gpu_blocks

    def _release_preserved(self, req: Request, strategy: Strategy, out: SchedulerOutput) -> None:
        """A request preserved through its call gives up its gpu cache: swapped out if asked and
        the cpu tier has room, dropped otherwise."""
        rid = req.request_id
        del self._preserved[rid]
        if strategy is Strategy.SWAP and self.bm.can_swap_out(rid):
            out.swap_out.extend(self.bm.swap_out(rid))
            out.swapped_out.append(rid)
            req.strategy = Strategy.SWAP
        else:
            self._discard(req, out)
            req.strategy = Strategy.DISCARD

    def _kv_tokens_held(self, rid: str) -> int:
        """Tokens `rid`'s gpu KV blocks hold (its state, if any, is priced by the cost model)."""
        blocks = self.bm.num_gpu_blocks_of(rid)
        return max(0, blocks - self.bm.state_blocks) * self.config.block_size

    def _review_paused(self, out: SchedulerOutput, ctx) -> None:
        """INFERCEPT's per-iteration rule (see `policies.infercept_review`)."""
        held = [(r, self._kv_tokens_held(rid)) for rid, r in self._preserved.items()]
        act, self._reclaimable = self.policy.review_paused(held, ctx)
        for rid, strategy in act.items():
            if strategy is not Strategy.PRESERVE:
                self._release_preserved(self._preserved[rid], strategy, out)

    def _discard(self, req: Request, out: SchedulerOutput) -> None:
        if req.num_computed:
            self._recompute_left[req.request_id] = req.num_computed
        self.bm.free(req.request_id)
        req.num_computed = 0
        out.discarded.append(req.request_id)

    def _preempt(self, req: Request, out: SchedulerOutput, swap: bool = False) -> None:
        """Send a running request back to the queue: its cache is swapped to the cpu tier when
        asked and there is room (FastServe), otherwise dropped and recomputed later (vLLM)."""
        self.running.remove(req)
        if swap and req.num_computed and self.bm.can_swap_out(req.request_id):
            out.swap_out.extend(self.bm.swap_out(req.request_id))
            req.status = Status.SWAPPED
        else:
            self._discard(req, out)
            req.status = Status.WAITING
        out.preempted.append(req.request_id)
        req.rank_cache = None
        self._add_waiting(req)

    def _preempt_for_waiting(self, out: SchedulerOutput, ctx) -> None:
        """Preemptive policies (MLFQ): if the best waiting request outranks the worst running
        ones and does not fit, swap those out for it (at most one admission's worth per step)."""
        self._order_queue(ctx)
        if not self.waiting:
            return
        best = self.waiting[0]
        prio = self.policy.priority
        key = prio(best, ctx)
        need = best.admit_need + self._watermark
        victims = []
        free = self.bm.free_gpu_blocks
        for victim in reversed(self.running):
            if free >= need or not prio(victim, ctx) > key:
                break
            victims.append(victim)
            free += self.bm.num_gpu_blocks_of(victim.request_id)
        if free < need:
            return  # preempting would not make room: leave the running batch alone
        for victim in victims:
            self._preempt(victim, out, swap=True)
