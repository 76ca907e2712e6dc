"""Summaries of a simulated (or real) run: latency percentiles and throughput."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from flexlamps.sched.records import RequestRecord


@dataclass
class Summary:
    policy: str
    qps: float
    num_requests: int
    e2e_mean: float
    e2e_p50: float
    e2e_p99: float
    ttft_mean: float
    ttft_p50: float
    ttft_p99: float
    norm_mean: float  # (E2E - sum of API time) / output tokens, seconds per token
    norm_p50: float
    norm_p99: float
    throughput_rps: float  # finished requests per second of simulated time
    throughput_tps: float  # output tokens per second
    sim_seconds: float = 0.0  # wall time the simulation took

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Summary":
        return cls(**d)


def summarize(records: list[RequestRecord], policy: str, qps: float, makespan: float,
              sim_seconds: float = 0.0) -> Summary:
    if not records:
        raise ValueError(f"{policy} at qps {qps}: no request finished; nothing to summarize")
    e2e = np.array([r.e2e for r in records])
    ttft = np.array([r.ttft for r in records])
    norm = np.array([r.normalized for r in records])
    out_tokens = sum(r.output_tokens for r in records)
    span = max(makespan, 1e-9)

    def pct(a, q):
        return float(np.percentile(a, q))

    return Summary(
        policy=policy, qps=qps, num_requests=len(records),
        e2e_mean=float(e2e.mean()), e2e_p50=pct(e2e, 50), e2e_p99=pct(e2e, 99),
        ttft_mean=float(ttft.mean()), ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99),
        norm_mean=float(norm.mean()), norm_p50=pct(norm, 50), norm_p99=pct(norm, 99),
        throughput_rps=len(records) / span, throughput_tps=out_tokens / span,
        sim_seconds=sim_seconds,
    )
