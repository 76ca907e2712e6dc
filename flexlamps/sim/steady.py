"""Steady-state measurement of a replayed load: warm-up and cool-down excluded, throughput
without the drain, and a window (stability) test.

A replay sends Poisson arrivals over [first, last]. The first `warmup` and the last `cooldown`
fractions of that span are excluded: requests arriving then meet an emptier system (the start)
or one that stops filling (the end). Over the measured span [t1, t2]:
- latency percentiles of the requests that arrived in it (every request runs to completion);
- offered load = arrivals in [t1, t2] / (t2 - t1); achieved throughput = completions in
  [t1, t2] / (t2 - t1), so the drain after the last arrival never counts;
- window test: does the latency grow with the time the system has been running? The mean E2E
  of the last third of the measured arrivals over that of the first third (`growth`). Below
  saturation the queue is stationary and the thirds agree up to noise; past it the queue
  grows without bound, and so does the latency with the window. A point is `stable` when
  growth <= `GROWTH_LIMIT` and the achieved throughput keeps up with the offered load
  (>= `KEEP_UP` of it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flexlamps.sim.metrics import Summary, summarize
from flexlamps.sim.simulator import RequestRecord

WARMUP, COOLDOWN = 0.15, 0.15
GROWTH_LIMIT = 1.25
KEEP_UP = 0.95


@dataclass(frozen=True)
class SteadyState:
    summary: Summary  # latencies of the measured requests; throughput without the drain
    offered_rps: float
    achieved_rps: float
    growth: float  # mean E2E, last third of the measured arrivals / first third
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
    e2e = np.array([r.e2e for r in inside])
    growth = float(e2e[-third:].mean() / max(e2e[:third].mean(), 1e-12))
    offered, achieved = len(inside) / length, done / length
    stable = growth <= GROWTH_LIMIT and achieved >= KEEP_UP * offered
    return SteadyState(summary, offered, achieved, growth, stable, len(inside), (t1, t2))
