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
| infercept | original arrival (FCFS)                 | min waste: swap budget to the most  |
|           |                                         | wasteful, then preserve / discard   |
| sjf       | predicted tokens left before next call  | min waste                           |
| lamps     | predicted memory x time of the rest of  | the min-waste strategy predicted    |
|           | the request, calls and their strategies | before scheduling (used in the      |
|           | included; re-ranked every k iterations; | rank); starvation guard promotes    |
|           |                                         | after N pass-overs                  |
| mlfq      | FastServe skip-join MLFQ level, arrival | min waste                           |
| vtc       | least service (VTC counter) per client  | min waste                           |

Waste formulas and their sources: `flexlamps.sched.waste`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.predictors import Predictor
from flexlamps.sched.request import Request, Status, Strategy
from flexlamps.sched.waste import memory_over_time, wastes


@dataclass
class PolicyContext:
    now: float
    iteration: int
    cost: CostModel
    predictor: Predictor
    batch_context_tokens: int  # C_batch: cached tokens of the running requests
    swap_budget_tokens: int  # tokens a swap can move this iteration without stalling it
    cpu_free_tokens: int  # room left on the cpu tier
    step_s: float  # recent iteration time
    # recompute tokens an iteration can carry beside the running decodes (INFERCEPT's chunk,
    # S - running tokens); the default is SchedulerConfig's token budget
    chunk_tokens: int = 2048


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
        w = wastes(c_i, max(0, ctx.batch_context_tokens - c_i), t_int, ctx.cost, ctx.chunk_tokens)
        scored.append((min(w[Strategy.PRESERVE], w[Strategy.DISCARD]), req, w))
    scored.sort(key=lambda t: -t[0])
    budget, cpu_free = ctx.swap_budget_tokens, ctx.cpu_free_tokens
    out: dict[str, Strategy] = {}
    for _, req, w in scored:
        c_i = req.num_computed
        if 0 < c_i <= min(budget, cpu_free):
            out[req.request_id] = Strategy.SWAP
            budget -= c_i
            cpu_free -= c_i
        elif w[Strategy.PRESERVE] <= w[Strategy.DISCARD]:
            out[req.request_id] = Strategy.PRESERVE
        else:
            out[req.request_id] = Strategy.DISCARD
    return out


def predicted_strategy(c_i: int, api_time: float, ctx: PolicyContext) -> Strategy:
    """The strategy a request is expected to get for a call of `api_time` seconds made with
    `c_i` tokens cached, chosen before it is scheduled (LAMPS): the least of the three wastes,
    preserve (Eq. 2), chunked discard (Eq. 4) and swap, priced as pipelined (free) when the
    cache fits one iteration's swap budget and the cpu tier, as Eq. 3 otherwise."""
    c_other = max(0, ctx.batch_context_tokens - c_i)
    w = wastes(c_i, c_other, api_time, ctx.cost, ctx.chunk_tokens)
    if c_i > ctx.cpu_free_tokens:
        del w[Strategy.SWAP]
    elif c_i <= ctx.swap_budget_tokens:
        w[Strategy.SWAP] = 0.0
    return min(w, key=w.get)


class Policy:
    name = "base"
    starvation_threshold: int | None = None  # promote a request passed over this many times
    # how often a waiting request's key must be recomputed: None = never (it is fixed while the
    # request waits), k = every k iterations
    rerank_every: int | None = None
    preemptive = False  # may a waiting request that outranks running ones take their place?

    def priority(self, req: Request, ctx: PolicyContext):
        return (req.arrival_time,)

    def choose_strategies(self, reqs: list[Request], ctx: PolicyContext) -> dict[str, Strategy]:
        return min_waste_strategies(reqs, ctx)

    def on_arrival(self, req: Request, active: list[Request]) -> None:
        pass

    def on_computed(self, req: Request, tokens: int, steps: int) -> None:
        """`req` processed `tokens` tokens over `steps` iterations (for service accounting)."""

    def on_finish(self, req: Request) -> None:
        """`req` left the system (drop any per-request state)."""


class FCFS(Policy):
    """vLLM: an API call ends the request's turn; its cache is dropped and the continuation
    joins the tail of the queue when the call returns (`queue_time` is reset on resume)."""

    name = "fcfs"

    def priority(self, req, ctx):
        return (req.queue_time, req.arrival_time)

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: Strategy.DISCARD for r in reqs}


class InferCept(Policy):
    name = "infercept"


class SJF(Policy):
    name = "sjf"

    def priority(self, req, ctx):
        return (ctx.predictor.output_tokens(req), req.arrival_time)


class LAMPS(Policy):
    """LAMPS (Shahout et al., arXiv 2410.18248; mars-repository/mars-codebase): rank waiting
    requests by the memory they are predicted to hold over time, their calls included, each
    call priced with the strategy chosen for it before it is scheduled; promote a request
    passed over `starvation_threshold` times; recompute ranks every `rerank_every` iterations.

    `horizon="segment"` ranks by the memory held until the next call returns (the paper's
    pre-API prediction); `"request"` adds the predicted later segments and calls too (the
    request's total length), which ranks multi-call requests better when predictable.
    `handling="planned"` handles each call with the strategy its rank assumed (LAMPS's code
    classifies a request on arrival and on every return); `"at_call"` re-decides at the call
    with INFERCEPT's min-waste choice and the batch of that moment."""

    name = "lamps"

    def __init__(self, starvation_threshold: int | None = 2000, rerank_every: int = 10,
                 horizon: str = "request", handling: str = "planned"):
        if horizon not in ("segment", "request"):
            raise ValueError(f"LAMPS horizon must be 'segment' or 'request', got {horizon!r}")
        if handling not in ("planned", "at_call"):
            raise ValueError(f"LAMPS handling must be 'planned' or 'at_call', got {handling!r}")
        self.starvation_threshold = starvation_threshold
        self.rerank_every = rerank_every
        self.horizon = horizon
        self.handling = handling
        self._future: dict[str, tuple[int, float]] = {}
        self._planned: dict[str, tuple[int, Strategy]] = {}  # id -> (segment, strategy)

    @staticmethod
    def _segment_mot(context: float, out: float, api_type, api_time: float,
                     ctx: PolicyContext) -> tuple[float, Strategy | None]:
        strategy = None
        if api_type:
            # the strategy the call is expected to get, chosen before scheduling (min waste)
            strategy = predicted_strategy(int(context + out), api_time, ctx)
        return memory_over_time(context, out, api_time, strategy, ctx.step_s, ctx.cost), strategy

    def score(self, req: Request, ctx: PolicyContext) -> float:
        pred = ctx.predictor
        out = pred.output_tokens(req)
        api_type, api_time = pred.next_call(req)
        total, strategy = self._segment_mot(req.num_tokens, out, api_type, api_time, ctx)
        if strategy is not None:
            self._planned[req.request_id] = (req.segment_index, strategy)
        # a request whose cache was discarded must first rebuild it, its cache growing from 0
        rebuild = req.num_tokens - 1 - req.num_computed if req.status is not Status.RUNNING else 0
        if rebuild > 1:
            total += rebuild * ctx.cost.prefill_time(rebuild) / 2
        if self.horizon == "request" and api_type:
            # later segments only change when the request moves on: cache them per segment
            cached = self._future.get(req.request_id)
            if cached is None or cached[0] != req.segment_index:
                context, later = req.num_tokens + out, 0.0
                for tokens, seg_api, seg_s, returned in pred.future_segments(req):
                    later += self._segment_mot(context, tokens, seg_api, seg_s, ctx)[0]
                    context += tokens + returned
                cached = self._future[req.request_id] = (req.segment_index, later)
            total += cached[1]
        return total

    def choose_strategies(self, reqs, ctx):
        if self.handling == "at_call":
            return min_waste_strategies(reqs, ctx)
        out, unplanned = {}, []
        cpu_free, budget = ctx.cpu_free_tokens, ctx.swap_budget_tokens
        for req in reqs:
            seg, strategy = self._planned.get(req.request_id, (-1, None))
            if seg != req.segment_index or (strategy is Strategy.SWAP and req.num_computed > cpu_free):
                unplanned.append(req)  # not ranked in this segment, or no cpu room left
                continue
            if strategy is Strategy.SWAP:
                cpu_free -= req.num_computed
                budget -= req.num_computed
            out[req.request_id] = strategy
        if unplanned:
            rest = replace(ctx, cpu_free_tokens=cpu_free, swap_budget_tokens=max(0, budget))
            out.update(min_waste_strategies(unplanned, rest))
        return out

    def on_finish(self, req: Request) -> None:
        self._future.pop(req.request_id, None)
        self._planned.pop(req.request_id, None)

    def priority(self, req, ctx):
        if req.promoted:
            return (0, req.arrival_time)
        if req.rank_cache is None or ctx.iteration % self.rerank_every == 0:
            req.rank_cache = self.score(req, ctx)
        return (1, req.rank_cache, req.arrival_time)


class MLFQ(Policy):
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


class VTC(Policy):
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


POLICIES = {p.name: p for p in (FCFS, InferCept, SJF, LAMPS, MLFQ, VTC)}


def make_policy(name: str, **kwargs) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(**kwargs)
