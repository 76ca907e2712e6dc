"""A trace's augmented requests replayed on an executor, under each scheduling policy and at each
arrival rate (`flexlamps agents --trace`): the requests drawn from the trace's templates, run on the
augmented face, summarized, and with a reference executor checked against their uninterrupted
generation."""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

from flexlamps.engine.augmented.engine import CpuClock, WallClock
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import AgentsConfig, run_policy_on_engine
from flexlamps.engine.executors.contract import Executor
from flexlamps.sched.cost_model import CostModel
from flexlamps.sim.metrics import summarize
from flexlamps.workloads.tokenized import TraceScale, replay_requests
from flexlamps.workloads.trace import Template


def _no_progress(policy: str, qps: float, total: int) -> ContextManager[Callable]:
    return contextlib.nullcontext(lambda record: None)


def replay_trace(executor: Executor, model_config, templates: list[Template], scale: TraceScale,
                 pools: AgentsConfig, cost: CostModel, *, policies: list[str], qps: list[float], num_requests: int,
                 seed: int, clock: str = "wall", reference: Executor | None = None,
                 progress: Callable[[str, float, int], ContextManager[Callable]] = _no_progress) -> list[tuple]:
    """(summary, result, outputs that differ from their uninterrupted generation or None) per
    (rate, policy): `num_requests` drawn with `seed` at each rate of `qps`, run on `executor` (built
    for `pools`) on the `clock` ("wall" or "cpu"); `reference`: the executor each output is checked
    against, alone (None: no check); `progress(policy, rate, total)`: a context giving a callback
    told of each finished request. `model_config` keeps the filler ids off its special tokens."""
    results = []
    for rate in qps:
        requests = replay_requests(model_config, templates, scale, rate, num_requests, seed)
        expected = uninterrupted_tokens(reference, requests) if reference is not None else None
        for policy in policies:
            with progress(policy, rate, len(requests)) as on_finish:
                res = run_policy_on_engine(executor, requests, policy, pools, cost, on_finish=on_finish,
                                           clock=CpuClock() if clock == "cpu" else WallClock())
            mismatched = None
            if expected is not None:
                mismatched = sorted(rid for rid, toks in res.tokens.items() if toks != expected[rid])
            results.append((summarize(res.records, policy, rate, res.end_time), res, mismatched))
    return results
