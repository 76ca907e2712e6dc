"""The augmented (LAMPS) face of the engine: continuous batching over requests that pause for
API calls, with the KV cache in fixed-size blocks (`PagedKVCache`).

One iteration:

    out = scheduler.schedule(now)                      # block ids and token counts only
    cache: swap out -> zero discarded blocks -> swap in  # the moves `out` lists, in that order
    forward: one micro-batch of every decode (a row's one pending token, the one it just
             sampled), one of every other 1-token chunk (run as a two-column prompt step), one
             per longer chunk (prompt / returned API tokens / chunked recompute of a discarded cache)
    sample (greedy) -> RunnerOutput(intercepted, finished) -> scheduler.update_from_output

A request whose segment ends is intercepted: its call runs (a trace's: sleeps for the segment's
scaled API time; a live tool: runs in a thread, see `calls`), then the call's returned tokens
join its context and the scheduler resumes it. Whatever the scheduler did with its cache meanwhile (preserve / swap / discard), the
engine only ever feeds `tokens[num_computed : num_computed + n]`, so the output equals an
uninterrupted generation.

A row's arithmetic depends on the row and its phase only (#43): every token but a decode is
computed in the prompt phase, however the token budget chunks it, so a request's tokens do not
depend on what shares its iterations (a discarded cache is recomputed in the prompt phase, which
equals the decodes it replaces only where both phases share arithmetic: fp32 and dense weights).

An iteration is one sweep of the executor (`forward_steps`): every chunk is a micro-batch of
its own (a micro-batch has one length T), but the weights are read once per layer for all of
them, so an offloaded model streams its weights once per iteration, as the CostModel prices.

Swap-outs come first because the blocks they vacate may already be granted (in the same
SchedulerOutput) to a swap-in or to a growing request; the BlockManager, for its part, gives the
cpu blocks a swap-in reads to no swap-out of the same output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from flexlamps.engine.augmented.calls import FINISHED, Calls, TraceCalls
from flexlamps.engine.batch.sampling import check_finite
from flexlamps.workloads.tokenized import TokenizedRequest
from flexlamps.engine.executors.contract import Executor, PagedCache
from flexlamps.engine.executors.step import Step, prompt_step
from flexlamps.sched.output import RunnerOutput, SchedulerOutput
from flexlamps.sched.request import Request, Status
from flexlamps.sched.scheduler import Scheduler
from flexlamps.sched.records import RequestRecord, SimStats


class WallClock:
    """Seconds since the run started; idle waits really sleep."""

    def __init__(self):
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.now()))

    def end_iteration(self) -> None:
        pass


class CpuClock:
    """Engine time that other processes cannot stretch: the CPU seconds this process spent
    (compute and scheduling) plus API waits, which are skipped over instead of slept through.
    For a machine shared with other jobs; meaningful with one compute thread (OMP_NUM_THREADS=1),
    since CPU time of parallel threads adds up."""

    def __init__(self):
        self._offset = -time.process_time()

    def now(self) -> float:
        return time.process_time() + self._offset

    def sleep_until(self, t: float) -> None:
        self._offset += max(0.0, t - self.now())

    def end_iteration(self) -> None:
        pass


class StepClock:
    """A deterministic clock for tests: each iteration takes `step_s`; waits jump ahead."""

    def __init__(self, step_s: float = 0.01):
        self.t, self.step_s = 0.0, step_s

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def end_iteration(self) -> None:
        self.t += self.step_s


@dataclass
class AugmentedResult:
    records: list[RequestRecord]
    stats: SimStats
    tokens: dict[str, list[int]] = field(default_factory=dict)  # full context of each finished request
    end_time: float = 0.0
    swapped_out_bytes: int = 0  # KV bytes copied to the cpu tier's swap pool
    tier_use: dict = field(default_factory=dict)  # per tier: bytes in use, peak and budget (TierUse)


class AugmentedEngine:
    """Drives `scheduler` with a real model: `executor` runs forwards over `cache`.

    Args:
        executor: any executor (see executors.contract): in memory, or offloaded across tiers.
        cache: the paged cache (`executor.new_paged_cache`) whose pools the BlockManager counts.
        scheduler: the same Scheduler the simulator drives (policy, predictor, cost model inside).
        clock: WallClock (default), CpuClock (shared machines) or StepClock (tests).
        check: run `scheduler.check_invariants()` and the engine's own checks every iteration.
        on_iteration: called with the scheduler after every iteration (tests).
        on_finish: called with each finished request's RequestRecord (progress bars).
        calls: what the requests do (`calls.Calls`); default: the requests' own trace segments.
    """

    def __init__(self, executor: Executor, cache: PagedCache, scheduler: Scheduler, clock=None,
                 check: bool = False, on_iteration=None, on_finish=None, calls: Calls | None = None):
        bm, state = scheduler.bm, getattr(cache, "state_blocks", 0)
        ring = getattr(cache, "ring_blocks", None)  # KV blocks a request keeps when every layer slides
        if (bm.num_gpu_blocks, bm.num_cpu_blocks, bm.block_size, bm.state_blocks, bm.max_blocks) != (
                cache.num_gpu_blocks, cache.num_cpu_blocks, cache.block_size, state, ring):
            raise ValueError(f"paged cache ({cache.num_gpu_blocks} gpu / {cache.num_cpu_blocks} cpu blocks of "
                             f"{cache.block_size}, {state} per state, at most {ring} a request) and scheduler "
                             f"({bm.num_gpu_blocks} / {bm.num_cpu_blocks} of {bm.block_size}, {bm.state_blocks} per "
                             f"state, at most {bm.max_blocks}) disagree; build both from one SchedulerConfig")
        self.executor, self.cache, self.sched = executor, cache, scheduler
        self.clock = clock or WallClock()
        self.check, self.on_iteration, self.on_finish = check, on_iteration, on_finish
        self.stats = SimStats()
        self._reqs: dict[str, TokenizedRequest] = {}
        self._state: dict[str, Request] = {}  # scheduler objects, kept after they finish
        self._tokens: dict[str, list[int]] = {}
        self._tables: dict[str, list[int]] = {}  # last gpu table seen, to zero it when freed
        self._sampled: dict[str, int] = {}  # index of each request's last sampled token
        self.calls = calls
        self.swapped_out_bytes = 0

    # -- the loop ------------------------------------------------------------------------------
    def run(self, requests: list[TokenizedRequest]) -> AugmentedResult:
        arrivals = sorted(requests, key=lambda r: r.spec.arrival_time)
        calls = self.calls = self.calls or TraceCalls(requests)
        self._register(arrivals, calls)
        arrivals.reverse()  # pop from the end
        records, finished_tokens = [], {}
        sched, clock = self.sched, self.clock
        while arrivals or calls.pending or sched.running or sched.num_waiting or sched.paused:
            now = clock.now()
            while arrivals and arrivals[-1].spec.arrival_time <= now:
                self._arrive(arrivals.pop())
            for rid, returned in calls.poll(now):
                if self._return_from_call(rid, returned, now):
                    self._finished(rid, now, records, finished_tokens)
            out = sched.schedule(now)
            self._apply_moves(out)
            if not (out.prefill or out.recompute or out.decode):
                if not (arrivals or calls.pending):
                    if sched.running or sched.num_waiting or sched.paused:
                        raise RuntimeError("augmented engine: requests remain but nothing can be scheduled "
                                           "(a request larger than the gpu pool?)")
                    continue  # the last calls just returned, ending their requests
                calls.wait(arrivals[-1].spec.arrival_time if arrivals else None, clock)
                continue
            start = clock.now()
            runner = self._forward_and_sample(out)
            clock.end_iteration()
            now = clock.now()
            sched.update_from_output(out, runner, now, now - start)
            self._count(out, now - start)
            for rid in runner.intercepted:
                self._intercepted(rid, now)
            for rid in runner.finished:
                self._finished(rid, now, records, finished_tokens)
            if self.check:
                self._check()
            if self.on_iteration is not None:
                self.on_iteration(sched)
        self.stats.end_time = clock.now()
        return AugmentedResult(records, self.stats, finished_tokens, self.stats.end_time, self.swapped_out_bytes)

    def _register(self, requests: list[TokenizedRequest], calls: Calls) -> None:
        pool_tokens = (self.cache.num_gpu_blocks - getattr(self.cache, "state_blocks", 0)) * self.cache.block_size
        for r in requests:
            rid = r.spec.request_id
            if rid in self._reqs:
                raise ValueError(f"request id {rid!r} appears twice; ids must be unique")
            if self.sched.bm.kv_blocks(calls.max_tokens(rid) + 1) * self.cache.block_size > pool_tokens:  # a ring
                raise ValueError(f"request {rid!r} grows to {calls.max_tokens(rid)} tokens but the gpu KV pool "
                                 f"holds {pool_tokens}; enlarge the pool or lower the context cap")
            self._reqs[rid] = r

    # -- events --------------------------------------------------------------------------------
    def _arrive(self, r: TokenizedRequest) -> None:
        spec = r.spec
        req = Request(spec.request_id, spec.arrival_time, spec.prompt_tokens,
                      client_id=spec.client_id, kind=spec.kind)
        self.sched.add_request(req)
        self._state[spec.request_id] = req
        self._tokens[spec.request_id] = list(r.prompt_ids)

    def _intercepted(self, rid: str, now: float) -> None:
        req = self.sched.paused[rid]
        self.calls.start(req, req.api_type, now)

    def _return_from_call(self, rid: str, returned: list[int] | None, now: float) -> bool:
        """Resume `rid` with the call's tokens; None: it ends with this call (returns True)."""
        req = self.sched.paused[rid]
        # how the call ended up handled (a preserved cache may be dropped during the call)
        self.stats.strategies[req.strategy.value] += 1
        if returned is None:
            self.sched.end_paused(rid, now)
            return True
        self._tokens[rid].extend(returned)
        self.sched.resume(rid, len(returned), now)
        return False

    def _finished(self, rid: str, now: float, records: list, finished_tokens: dict) -> None:
        records.append(self._record(rid, now))
        if self.on_finish is not None:
            self.on_finish(records[-1])
        finished_tokens[rid] = self._tokens.pop(rid)
        self.cache.free_blocks(self._tables.pop(rid, ()))

    # -- cache moves ---------------------------------------------------------------------------
    def _apply_moves(self, out: SchedulerOutput) -> None:
        self.cache.swap_out(out.swap_out)
        self.swapped_out_bytes += len(out.swap_out) * self.cache.block_bytes
        for rid in out.discarded:
            self.cache.free_blocks(self._tables.pop(rid, ()))
        for rid in (*out.swapped_out, *out.preempted):  # gpu blocks gone to the cpu tier (or freed above)
            self._tables.pop(rid, None)
        self.cache.swap_in(out.swap_in)
        for rid, table in out.block_tables.items():
            self._tables[rid] = list(table)

    # -- forward -------------------------------------------------------------------------------
    def _forward_and_sample(self, out: SchedulerOutput) -> RunnerOutput:
        work = [(rid, 1) for rid in out.decode]
        work += [(rid, out.prefill.get(rid, 0) + out.recompute.get(rid, 0))
                 for rid in dict.fromkeys([*out.recompute, *out.prefill])]
        decodes = [w for w in work if w[1] == 1 and self._decodes(w[0])]
        short = [w for w in work if w[1] == 1 and not self._decodes(w[0])]
        groups = [g for g in (decodes, short) if g] + [[w] for w in work if w[1] > 1]
        last_logits: dict[str, torch.Tensor] = {}
        for group, logits in zip(groups, self._forward(groups, out)):
            for (rid, _), row in zip(group, logits[:, 0]):
                last_logits[rid] = row
        runner = RunnerOutput()
        for rid in out.sampling:
            token = int(last_logits[rid].argmax())
            check_finite(last_logits[rid][token:token + 1])
            self._sampled[rid] = len(self._tokens[rid])
            self._tokens[rid].append(token)
            verdict = self.calls.on_token(self._state[rid], self._tokens[rid])
            if verdict is FINISHED:
                runner.finished.add(rid)
            elif verdict is not None:
                runner.intercepted[rid] = verdict
        return runner

    def _decodes(self, rid: str) -> bool:
        """Whether `rid`'s next token is a decode: its one pending token is the one it last sampled."""
        pending = len(self._tokens[rid]) - self._state[rid].num_computed
        return pending == 1 and self._sampled.get(rid) == len(self._tokens[rid]) - 1

    def _forward(self, groups: list[list[tuple[str, int]]], out: SchedulerOutput) -> list[torch.Tensor]:
        """One sweep of the executor over every group: one micro-batch per group, of rows of
        equal length n (all 1, or a single chunk): the decodes as a decode step, any other group
        as a prompt step. Returns per group the logits (rows, 1, vocab) at each row's last fed token."""
        rows = [rid for group in groups for rid, _ in group]
        slots = self.cache.set_block_tables([out.block_tables[rid] for rid in rows])
        device, steps, first = self.cache.device, [], 0
        for group in groups:
            n = group[0][1]
            starts = [self._state[rid].num_computed for rid, _ in group]
            ids = [self._tokens[rid][start:start + n] for (rid, _), start in zip(group, starts)]
            for (rid, _), toks in zip(group, ids):
                assert len(toks) == n, f"{rid}: {len(toks)} tokens to feed, scheduled {n}"
            rows_slots = slots[first:first + len(group)]
            if n == 1 and self._decodes(group[0][0]):
                steps.append(Step(torch.tensor(ids, device=device), torch.tensor(starts, device=device)[:, None],
                                  rows_slots, torch.zeros(len(group), dtype=torch.long, device=device)))
            else:
                steps.append(prompt_step(ids, starts, rows_slots, device))
            first += len(group)
        return self.executor.forward_steps(self.cache, steps)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _count(self, out: SchedulerOutput, seconds: float) -> None:
        s = self.stats
        s.iterations += 1
        s.schedule_calls += 1
        s.busy_s += seconds
        s.prefill_tokens += sum(out.prefill.values())
        s.recompute_tokens += sum(out.recompute.values())
        s.decode_tokens += len(out.decode)
        s.swap_tokens += out.swap_tokens
        s.preemptions += len(out.preempted)

    def _record(self, rid: str, now: float) -> RequestRecord:
        req, spec = self._state[rid], self._reqs[rid].spec
        return RequestRecord(
            request_id=rid, kind=spec.kind, client_id=spec.client_id, arrival=spec.arrival_time,
            first_token=req.first_token_time, finish=now, output_tokens=req.output_tokens,
            api_seconds=self.calls.api_seconds(rid), num_calls=self.calls.num_calls(rid))

    def _check(self) -> None:
        self.sched.check_invariants()
        bm = self.sched.bm
        assert self.cache.gpu_pool_bytes == bm.num_gpu_blocks * self.cache.block_bytes
        assert self.cache.cpu_pool_bytes == bm.num_cpu_blocks * self.cache.block_bytes
        for rid, req in self.sched.requests.items():
            assert len(self._tokens[rid]) == req.num_tokens, \
                f"{rid}: engine holds {len(self._tokens[rid])} tokens, scheduler counts {req.num_tokens}"
            if req.status is Status.RUNNING:
                assert bm.num_gpu_blocks_of(rid) >= bm.blocks_held(req.num_computed)
