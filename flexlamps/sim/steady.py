"""Steady-state measurement of a replayed load: warm-up and cool-down excluded, throughput
without the drain, and a window (stability) test.

A replay sends Poisson arrivals over [first, last]. The first `warmup` and the last `cooldown`
fractions of that span are excluded: requests arriving then meet an emptier system (the start)
or one that stops filling (the end). Over the measured span [t1, t2]:
- latency percentiles of the requests that arrived in it (every request runs to completion);
- offered load = arrivals in [t1, t2] / (t2 - t1); achieved throughput = completions in
  [t1, t2] / (t2 - t1), so the drain after the last arrival never counts;
- window test: does the latency grow with the time the system has been running? The latency
  the server adds (E2E minus the time inside API calls, which no scheduler can change and
  whose 60 s human turns would drown the signal), median over the last third of the measured
  arrivals over the median of the first third (`growth`). Below saturation the queue is
  stationary and the thirds agree up to noise; past it the queue grows without bound, and so
  does the latency with the window. A point is `stable` when growth <= `GROWTH_LIMIT`.

The achieved throughput is reported beside the offered load but does not decide stability:
requests whose calls last minutes keep finishing for minutes after they arrive, so a replay
that started empty completes fewer requests than arrive until it has run longer than the
latency tail (2-6% fewer in a 600 s multi-API replay whose P99 E2E is 300 s, stable or not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flexlamps.sim.metrics import Summary, summarize
from flexlamps.sched.records import RequestRecord

WARMUP, COOLDOWN = 0.15, 0.15
GROWTH_LIMIT = 1.25


@dataclass(frozen=True)
class SteadyState:
    summary: Summary  # latencies of the measured requests; throughput without the drain
    offered_rps: float
    achieved_rps: float
    growth: float  # median E2E - API time, last third of the measured arrivals / first third
    stable: bool
    measured: int  # requests that arrived in the measured span
    span: tuple[float, float]

    def to_json(self) -> dict:
        return {**self.summary.to_json(), "offered_rps": self.offered_rps,
                "achieved_rps": self.achieved_rps, "growth": self.growth, "stable": self.stable,
                "measured": self.measured, "span": list(self.span)}


def measured_span(records: list[RequestRecord], warmup: float = WARMUP,
                  cooldown: float = COOLDOWN) -> tuple[float, float]:
    if not 0 <= warmup < 1 or not 0 <= cooldown < 1 or warmup + cooldown >= 1:
        raise ValueError(f"warm-up {warmup} and cool-down {cooldown} must be fractions summing below 1")
    arrivals = [r.arrival for r in records]
    first, last = min(arrivals), max(arrivals)
    width = last - first
    return first + warmup * width, last - cooldown * width


def steady_state(records: list[RequestRecord], policy: str, qps: float, warmup: float = WARMUP,
                 cooldown: float = COOLDOWN, sim_seconds: float = 0.0) -> SteadyState:
    """Steady-state figures of one run (every request finished; see the module docstring)."""
    if len(records) < 6:
        raise ValueError(f"{policy} at qps {qps}: {len(records)} requests are too few to measure "
                         "a steady state; lengthen the window")
    t1, t2 = measured_span(records, warmup, cooldown)
    inside = sorted((r for r in records if t1 <= r.arrival <= t2), key=lambda r: r.arrival)
    if len(inside) < 6:
        raise ValueError(f"{policy} at qps {qps}: only {len(inside)} requests arrived in the "
                         "measured span; lengthen the window")
    length = max(t2 - t1, 1e-9)
    done = sum(1 for r in records if t1 <= r.finish <= t2)
    tokens = sum(r.output_tokens for r in records if t1 <= r.finish <= t2)
    summary = summarize(inside, policy, qps, length, sim_seconds)
    summary.throughput_rps, summary.throughput_tps = done / length, tokens / length
    third = len(inside) // 3
    served = np.array([r.e2e - r.api_seconds for r in inside])
    growth = float(np.median(served[-third:]) / max(np.median(served[:third]), 1e-12))
    offered, achieved = len(inside) / length, done / length
    stable = growth <= GROWTH_LIMIT
    return SteadyState(summary, offered, achieved, growth, stable, len(inside), (t1, t2))
