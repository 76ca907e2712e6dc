"""Small synthetic augmented workloads (for tests and quick studies without the trace)."""

from __future__ import annotations

import random

from flexlamps.sched.request import RequestSpec, Segment

# kind -> (mean API seconds, max returned tokens), loosely after the INFERCEPT mix
KINDS = {"math": (1e-4, 20), "qa": (0.4, 30), "chatbot": (8.0, 10), "image": (4.0, 6)}


def synthetic_specs(n: int = 60, qps: float = 6.0, seed: int = 0, max_calls: int = 4,
                    max_prompt: int = 120, max_output: int = 40) -> list[RequestSpec]:
    """`n` requests, Poisson arrivals at `qps`, each with 0..max_calls API calls."""
    rng = random.Random(seed)
    t, specs = 0.0, []
    for i in range(n):
        t += rng.expovariate(qps)
        kind = rng.choice(list(KINDS))
        mean_api, ret = KINDS[kind]
        segs = [Segment(rng.randint(1, max_output), kind, rng.expovariate(1 / mean_api), rng.randint(1, ret))
                for _ in range(rng.randint(0, max_calls))]
        segs.append(Segment(rng.randint(1, max_output)))
        specs.append(RequestSpec(f"r{i}", rng.randint(4, max_prompt), tuple(segs), t, client_id=kind, kind=kind))
    return specs
