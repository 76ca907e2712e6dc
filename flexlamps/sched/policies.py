"""Scheduling policies for augmented requests, behind one small interface.

A policy answers two questions for the Scheduler:
- `priority(req, ctx)`: the sort key (lower runs first) used to order admissions, to spend the
  token budget, and (largest key) to pick a preemption victim;
- `choose_strategies(reqs, ctx)`: what to do with each intercepted request's cache during its
  API call (preserve / swap / discard).

| name      | order                                   | during a call                       |
|-----------|-----------------------------------------|-------------------------------------|
| fcfs      | queue time; continuations re-queued at  | discard (vLLM's default)            |
|           | the tail when their call returns        |                                     |
| infercept | original arrival (FCFS)                 | INFERCEPT's code: every call starts |
|           |                                         | preserved; each iteration discards  |
|           |                                         | the preserved requests whose Eq. 4  |
|           |                                         | waste is below their Eq. 2 waste,   |
|           |                                         | except the most wasteful, which is  |
|           |                                         | swapped out only under pressure     |
| sjf       | predicted tokens left before next call  | min waste at the call               |
| lamps     | predicted memory x time until the next  | the strategy classified before it   |
|           | call returns (its strategy included);   | is scheduled, applied by the same   |
|           | re-ranked every k iterations; a request | per-iteration rule as infercept     |
|           | waiting 100 iterations goes first       |                                     |
| lamps-ts  | ours: lamps's rank; a request waiting   | preserved until memory runs short;  |
|           | past 4x the typical wait goes first     | then the caches idling longest are  |
|           | (FCFS among those)                      | dropped or swapped, the cheaper     |
| infercept-| original arrival (FCFS)                 | the paper's min-waste choice, made  |
| at-call   |                                         | once at the call                    |
| mlfq      | FastServe skip-join MLFQ level, arrival | min waste at the call               |
| vtc       | least service (VTC counter) per client  | min waste at the call               |

Waste formulas and their sources: `flexlamps.sched.waste`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.predictors import Predictor
from flexlamps.sched.request import Request, Status, Strategy
from flexlamps.sched.waste import (infercept_discard_waste, memory_over_time, waste_preserve, waste_swap,
                                   wastes)


@dataclass
class PolicyContext:
    now: float
    iteration: int
    cost: CostModel
    predictor: Predictor
    batch_context_tokens: int  # cached tokens of the running requests (C_other of a paused one)
    swap_budget_tokens: int  # tokens a swap can move this iteration without stalling it
    cpu_free_tokens: int  # room left on the cpu tier
    step_s: float  # recent iteration time
    # recompute tokens an iteration can carry beside the running requests (INFERCEPT's chunk
    # c_h = S - running tokens); the default is SchedulerConfig's token budget
    chunk_tokens: int = 2048
    budget_tokens: int = 2048  # S: the iteration's token budget

    def discard_waste(self, c_i: int, c_other: int | None = None) -> float:
        """Eq. 4 as INFERCEPT's code prices it, in token x seconds, for a `c_i`-token cache
        recomputed beside the running batch (`c_other` defaults to its cached tokens)."""
        cost = self.cost
        return infercept_discard_waste(
            c_i, self.batch_context_tokens if c_other is None else c_other, self.chunk_tokens,
            cost.compute_time(self.budget_tokens, 0, 0),
            cost.prefill_per_token_s + cost.kv_read_per_token_s)


def min_waste_strategies(reqs: list[Request], ctx: PolicyContext) -> dict[str, Strategy]:
    """INFERCEPT's min-waste choice (Sec. 4.3): order the intercepted requests by what they
    would otherwise waste, min(preserve, chunked discard) (Eq. 5), most wasteful first; give
    them pipelined swaps while the iteration's swap budget and the cpu tier last (a hidden swap
    wastes nothing); every other request gets the cheaper of preserve (Eq. 2) and chunked
    discard (Eq. 4)."""
    scored = []
    for req in reqs:
        c_i = req.num_computed
        t_int = ctx.predictor.api_time(req.api_type, req)
        # the intercepted requests have left the running batch: C_other is all of it
        w = wastes(c_i, ctx.batch_context_tokens, t_int, ctx.cost, ctx.chunk_tokens, ctx.budget_tokens)
        scored.append((min(w[Strategy.PRESERVE], w[Strategy.DISCARD]), req, w))
    scored.sort(key=lambda t: -t[0])
    budget, cpu_free = ctx.swap_budget_tokens, ctx.cpu_free_tokens
    out: dict[str, Strategy] = {}
    for _, req, w in scored:
        c_i = req.num_computed
        moved = c_i + ctx.cost.state_tokens  # a hybrid model's state moves with the KV blocks
        if 0 < c_i and moved <= min(budget, cpu_free):
            out[req.request_id] = Strategy.SWAP
            budget -= moved
            cpu_free -= moved
        elif w[Strategy.PRESERVE] <= w[Strategy.DISCARD]:
            out[req.request_id] = Strategy.PRESERVE
        else:
            out[req.request_id] = Strategy.DISCARD
    return out


def classify(c_i: int, api_time: float, ctx: PolicyContext) -> tuple[Strategy, float]:
    """LAMPS's `classify` (mars-repository/mars-codebase, vllm/core/scheduler_v2.py): before a
    request is scheduled, the strategy its next call will get and that call's waste, in token
    x seconds, from predicted values: preserve (Eq. 2), chunked discard (Eq. 4 as INFERCEPT's
    code prices it, with the batch of the moment) and swap (Eq. 3; LAMPS prices it with its own
    profiled fit), the least of the three; swap only while the cpu tier has room. A hybrid
    model's state (`cost.state_tokens`) is held by a preserve and moved by a swap beside the KV."""
    held = c_i + ctx.cost.state_tokens
    w = {Strategy.PRESERVE: waste_preserve(held, api_time, 1.0),
         Strategy.DISCARD: ctx.discard_waste(c_i)}
    if held <= ctx.cpu_free_tokens:
        w[Strategy.SWAP] = waste_swap(held, ctx.batch_context_tokens, ctx.cost.swap_time(held), 1.0)
    best = min(w, key=w.get)
    return best, w[best]


def predicted_strategy(c_i: int, api_time: float, ctx: PolicyContext) -> Strategy:
    """The strategy LAMPS classifies a call of `api_time` seconds made with `c_i` cached tokens."""
    return classify(c_i, api_time, ctx)[0]


def infercept_review(paused: list[tuple[Request, int]], ctx: PolicyContext, waste_of):
    """INFERCEPT's per-iteration rule for requests preserved through a call (its code,
    WukLab/InferCept vllm/core/scheduler_v2.py, `_schedule_chunk_and_fill`): each preserved
    request whose handling `waste_of(req, tokens)` -> (strategy, waste) is not preserve is a
    candidate; every candidate wasting less than the most wasteful one is handled now; the
    most wasteful stay preserved as the ones memory is reclaimed from under pressure (swapped
    out, or discarded when the cpu tier is full). Returns ({id: strategy}, reclaimable)."""
    cands = []
    for req, tokens in paused:
        strategy, waste = waste_of(req, tokens)
        if strategy is not Strategy.PRESERVE:
            cands.append((waste, strategy, req))
    if not cands:
        return {}, []
    top = max(w for w, _, _ in cands)
    act = {r.request_id: s for w, s, r in cands if w < top}
    return act, [r for w, _, r in cands if w >= top]


class SchedulingPolicy:
    name = "base"
    # starvation guard: None = none; otherwise a request is promoted to the head of the queue
    # after `starvation_threshold` counts of `starvation_counter`: "iteration" (LAMPS's code:
    # every iteration it waits) or "pass_over" (iterations in which a later arrival was admitted)
    starvation_threshold: int | None = None
    starvation_counter = "iteration"
    # how often a waiting request's key must be recomputed: None = never (it is fixed while the
    # request waits), k = every k iterations
    rerank_every: int | None = None
    preemptive = False  # may a waiting request that outranks running ones take their place?
    preempt_by_swap = False  # running victims of memory pressure: swapped out (else recomputed)
    reviews_paused = False  # calls start preserved and `review_paused` runs every iteration

    def priority(self, req: Request, ctx: PolicyContext):
        return (req.arrival_time,)

    def running_priority(self, req: Request, ctx: PolicyContext):
        """Order of the running batch (token budget first, preemption victims last)."""
        return self.priority(req, ctx)

    def choose_strategies(self, reqs: list[Request], ctx: PolicyContext) -> dict[str, Strategy]:
        if self.reviews_paused:
            return {r.request_id: Strategy.PRESERVE for r in reqs}
        return min_waste_strategies(reqs, ctx)

    def review_paused(self, paused: list[tuple[Request, int]], ctx: PolicyContext):
        """For requests preserved through a call, each with the gpu tokens it holds: what to do
        with them now ({id: strategy}) and which stay reclaimable under memory pressure."""
        return {}, [r for r, _ in paused]

    def reclaim_strategy(self, tokens: int, ctx: PolicyContext) -> Strategy:
        """How a reviewing policy frees a preserved cache of `tokens` under memory pressure:
        swapped out (INFERCEPT's `passive_discard_by_order`; a full cpu tier drops it)."""
        return Strategy.SWAP

    def on_arrival(self, req: Request, active: list[Request]) -> None:
        pass

    def on_admit(self, req: Request, now: float) -> None:
        """`req` left the queue for the running batch at `now`."""

    def on_computed(self, req: Request, tokens: int, steps: int) -> None:
        """`req` processed `tokens` tokens of its own (prompt or returned API tokens; decodes are
        1 token x `steps` iterations) for service accounting; recomputation of a cache the
        scheduler dropped is not the request's service and is not reported."""

    def on_finish(self, req: Request) -> None:
        """`req` left the system (drop any per-request state)."""


class FCFS(SchedulingPolicy):
    """vLLM: an API call ends the request's turn; its cache is dropped and the continuation
    joins the tail of the queue when the call returns (`queue_time` is reset on resume)."""

    name = "fcfs"

    def priority(self, req, ctx):
        return (req.queue_time, req.arrival_time)

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: Strategy.DISCARD for r in reqs}


class InferCept(SchedulingPolicy):
    """INFERCEPT as its code runs (WukLab/InferCept, api policy "V" with chunk fill): FCFS by
    original arrival; every call starts preserved; each iteration, a preserved request whose
    chunked-discard waste (Eq. 4 as the code prices it) is below its preserve waste over the
    call's remaining time (Eq. 2) is a candidate, and all candidates but the most wasteful are
    discarded; that one is swapped out (or discarded when the cpu tier is full) only when
    memory runs short. Running requests preempted for memory are swapped out too."""

    name = "infercept"
    reviews_paused = True
    preempt_by_swap = True

    def review_paused(self, paused, ctx):
        pred = ctx.predictor

        def waste_of(req, tokens):
            left = max(0.0, req.api_start + pred.api_time(req.api_type, req) - ctx.now)
            w_p, w_d = waste_preserve(tokens, left, 1.0), ctx.discard_waste(tokens)
            return (Strategy.DISCARD, w_d) if w_d < w_p else (Strategy.PRESERVE, w_p)

        return infercept_review(paused, ctx, waste_of)


class InferCeptAtCall(SchedulingPolicy):
    """The min-waste choice made once, at the call (INFERCEPT's paper, Sec. 4.3): the swap
    budget to the most wasteful, then the cheaper of preserve (Eq. 2) and discard (Eq. 4)."""

    name = "infercept-at-call"


class SJF(SchedulingPolicy):
    name = "sjf"

    def priority(self, req, ctx):
        return (ctx.predictor.output_tokens(req), req.arrival_time)


class LAMPS(SchedulingPolicy):
    """LAMPS (Shahout et al., arXiv 2410.18248; mars-repository/mars-codebase): rank waiting
    requests by the memory they are predicted to hold over time until their next call returns,
    the call priced with the strategy classified for it before it is scheduled; recompute
    ranks every `rerank_every` iterations; the running batch stays in arrival order (its
    `get_priority(running=True)`).

    Defaults as LAMPS's code and paper run it: `horizon="segment"` (the next call only),
    `handling="planned"` (the call is handled with the classified strategy by INFERCEPT's
    per-iteration rule: preserved first, the planned discards / swaps applied to all but the
    most wasteful), a starvation counter that grows every iteration a request waits (status
    WAITING) and promotes it at 100 (the paper's best; `sequence.py`'s
    `increment_starvation`). In the released code that counter never moves for SchedulerV2
    (it only counts requests whose `time_before_processing` > 0, which only the vLLM
    scheduler sets); we count as the paper describes.

    Variants kept as options: `horizon="request"` adds the predicted later segments and calls;
    `handling="at_call"` re-decides at the call with INFERCEPT's min-waste choice;
    `starvation_counter="pass_over"` counts only iterations in which a later arrival was
    admitted (this simulator's earlier guard, threshold 2000)."""

    name = "lamps"
    preempt_by_swap = True

    def __init__(self, starvation_threshold: int | None = 100, rerank_every: int = 10,
                 horizon: str = "segment", handling: str = "planned",
                 starvation_counter: str = "iteration"):
        if horizon not in ("segment", "request"):
            raise ValueError(f"LAMPS horizon must be 'segment' or 'request', got {horizon!r}")
        if handling not in ("planned", "at_call"):
            raise ValueError(f"LAMPS handling must be 'planned' or 'at_call', got {handling!r}")
        if starvation_counter not in ("iteration", "pass_over"):
            raise ValueError("LAMPS starvation_counter must be 'iteration' or 'pass_over', "
                             f"got {starvation_counter!r}")
        self.starvation_threshold = starvation_threshold
        self.starvation_counter = starvation_counter
        self.rerank_every = rerank_every
        self.horizon = horizon
        self.handling = handling
        self.reviews_paused = handling == "planned"
        self._future: dict[str, tuple[int, float]] = {}
        # id -> (segment, strategy, waste) classified for the call ending that segment
        self._planned: dict[str, tuple[int, Strategy, float]] = {}

    @staticmethod
    def _segment_mot(context: float, out: float, api_type, api_time: float,
                     ctx: PolicyContext) -> tuple[float, Strategy | None, float]:
        strategy, waste = None, 0.0
        if api_type:
            strategy, waste = classify(int(context + out), api_time, ctx)
        return memory_over_time(context, out, api_time, strategy, ctx.step_s, ctx.cost), strategy, waste

    def score(self, req: Request, ctx: PolicyContext) -> float:
        pred = ctx.predictor
        out = pred.output_tokens(req)
        api_type, api_time = pred.next_call(req)
        total, strategy, waste = self._segment_mot(req.num_tokens, out, api_type, api_time, ctx)
        if strategy is not None:
            self._planned[req.request_id] = (req.segment_index, strategy, waste)
        # a request whose cache was discarded must first rebuild it, its cache growing from 0
        rebuild = req.num_tokens - 1 - req.num_computed if req.status is not Status.RUNNING else 0
        if rebuild > 1:
            total += rebuild * ctx.cost.prefill_time(rebuild) / 2
        if self.horizon == "request" and api_type:
            total += self._later(req, out, ctx)
        return total

    def _later(self, req: Request, out: float, ctx: PolicyContext) -> float:
        # later segments only change when the request moves on: cache them per segment
        cached = self._future.get(req.request_id)
        if cached is None or cached[0] != req.segment_index:
            context, later = req.num_tokens + out, 0.0
            for tokens, seg_api, seg_s, returned in ctx.predictor.future_segments(req):
                later += self._segment_mot(context, tokens, seg_api, seg_s, ctx)[0]
                context += tokens + returned
            cached = self._future[req.request_id] = (req.segment_index, later)
        return cached[1]

    def _plan(self, req: Request, tokens: int, ctx: PolicyContext) -> tuple[Strategy, float]:
        seg, strategy, waste = self._planned.get(req.request_id, (-1, None, 0.0))
        if seg != req.segment_index:  # never ranked in this segment: classify it now
            strategy, waste = classify(tokens, ctx.predictor.api_time(req.api_type, req), ctx)
        return strategy, waste

    def choose_strategies(self, reqs, ctx):
        if self.handling == "at_call":
            return min_waste_strategies(reqs, ctx)
        return {r.request_id: Strategy.PRESERVE for r in reqs}

    def review_paused(self, paused, ctx):
        return infercept_review(paused, ctx, lambda req, tokens: self._plan(req, tokens, ctx))

    def on_finish(self, req: Request) -> None:
        self._future.pop(req.request_id, None)
        self._planned.pop(req.request_id, None)

    def running_priority(self, req, ctx):
        return (req.arrival_time,)

    def priority(self, req, ctx):
        if req.promoted:
            return (0, req.arrival_time)
        if req.rank_cache is None or ctx.iteration % self.rerank_every == 0:
            req.rank_cache = self.score(req, ctx)
        return (1, req.rank_cache, req.arrival_time)


class LAMPSTailSafe(LAMPS):
    """Ours (`lamps-ts`): LAMPS's memory-over-time rank with two changes.

    - A slack-aware guard instead of a fixed starvation count: a request that has waited in
      the queue longer than `slack` times the typical wait (an exponential average of the
      waits of admitted requests, at least `min_wait_s`) is served before every ranked
      request, oldest arrival first. Short jobs still jump ahead while queues are short-lived,
      which keeps LAMPS's mean gain, but no request waits many typical waits (the tail).
    - Lazy handling of calls (`handling="lazy"`): a cache stays preserved through its call
      until memory is actually short; then the caches idling longest (preserve waste left:
      remaining call time x tokens) go first, each dropped or swapped, whichever wastes less
      (chunked discard, Eq. 4 as INFERCEPT prices it, vs. swap, Eq. 3). INFERCEPT's rule
      discards by waste even when memory is plentiful, and with a 384-token budget the
      recomputation it causes (~40% of the tokens computed on the multi-API trace) slows
      every iteration; below saturation that is the time the others all spend alike.
    `handling="planned"` keeps LAMPS's handling."""

    name = "lamps-ts"

    def __init__(self, slack: float = 4.0, min_wait_s: float = 0.5, handling: str = "lazy", **kw):
        kw.setdefault("starvation_threshold", None)
        super().__init__(handling="planned" if handling == "lazy" else handling, **kw)
        if slack <= 0 or min_wait_s < 0:
            raise ValueError(f"lamps-ts needs slack > 0 and min_wait_s >= 0, got {slack}, {min_wait_s}")
        self.handling = handling
        self.slack, self.min_wait_s = slack, min_wait_s
        self.typical_wait = 0.0

    def review_paused(self, paused, ctx):
        if self.handling != "lazy":
            return super().review_paused(paused, ctx)
        pred = ctx.predictor

        def idle_left(item):
            req, tokens = item
            held = tokens + ctx.cost.state_tokens
            return held * max(0.0, req.api_start + pred.api_time(req.api_type, req) - ctx.now)

        return {}, [r for r, _ in sorted(paused, key=idle_left)]  # the last is taken first

    def reclaim_strategy(self, tokens, ctx):
        held = tokens + ctx.cost.state_tokens
        if self.handling != "lazy" or held > ctx.cpu_free_tokens:
            return Strategy.SWAP if self.handling != "lazy" else Strategy.DISCARD
        swap = waste_swap(held, ctx.batch_context_tokens, ctx.cost.swap_time(held), 1.0)
        return Strategy.SWAP if swap < ctx.discard_waste(tokens) else Strategy.DISCARD

    def on_admit(self, req: Request, now: float) -> None:
        self.typical_wait = 0.98 * self.typical_wait + 0.02 * (now - req.queued_at)

    def priority(self, req, ctx):
        if req.promoted or ctx.now - req.queued_at > self.slack * max(self.typical_wait, self.min_wait_s):
            return (0, req.arrival_time)
        return super().priority(req, ctx)


class MLFQ(SchedulingPolicy):
    """FastServe's skip-join MLFQ: a new job joins the highest level whose quantum covers its
    first iteration (the prefill), and drops a level each time it uses up its quantum."""

    name = "mlfq"
    preemptive = True

    def __init__(self, base_quantum: int = 8, levels: int = 8):
        self.base_quantum, self.levels = base_quantum, levels
        self._step_s = None

    def quantum(self, level: int) -> int:
        return self.base_quantum * 2**level

    def priority(self, req, ctx):
        if req.output_tokens == 0 and req.mlfq_used == 0:
            # skip-join: prefill time measured in decode iterations
            first = ctx.cost.prefill_time(req.prompt_tokens) / max(ctx.step_s, 1e-6)
            level = 0
            while level < self.levels - 1 and self.quantum(level) < first:
                level += 1
            req.mlfq_level = max(req.mlfq_level, level)
        return (req.mlfq_level, req.arrival_time)

    def on_computed(self, req, tokens, steps):
        req.mlfq_used += steps
        while req.mlfq_level < self.levels - 1 and req.mlfq_used >= self.quantum(req.mlfq_level):
            req.mlfq_used -= self.quantum(req.mlfq_level)
            req.mlfq_level += 1


class VTC(SchedulingPolicy):
    """Virtual Token Counter (Sheng et al., OSDI'24): serve the client that has received the
    least weighted service (prompt tokens x 1, generated tokens x 2); a client returning from
    idleness is lifted to the least counter among active clients."""

    name = "vtc"
    rerank_every = 1  # counters move every iteration

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0):
        self.wi, self.wo = input_weight, output_weight
        self.counters: dict[str, float] = {}

    def on_arrival(self, req, active):
        active_clients = {r.client_id for r in active if r is not req}
        if req.client_id not in active_clients:
            live = [self.counters.get(c, 0.0) for c in active_clients]
            lifted = min(live) if live else 0.0
            self.counters[req.client_id] = max(self.counters.get(req.client_id, 0.0), lifted)

    def priority(self, req, ctx):
        return (self.counters.get(req.client_id, 0.0), req.arrival_time)

    def on_computed(self, req, tokens, steps):
        w = self.wo * steps if tokens == 1 else self.wi * tokens
        self.counters[req.client_id] = self.counters.get(req.client_id, 0.0) + w


POLICIES = {p.name: p for p in (FCFS, InferCept, InferCeptAtCall, SJF, LAMPS, LAMPSTailSafe, MLFQ, VTC)}


def make_policy(name: str, **kwargs) -> SchedulingPolicy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(**kwargs)
