"""One simulation run from names: trace file, policy, qps, predictor kind and noise."""

from __future__ import annotations

import time
from dataclasses import dataclass

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import make_policy
from flexlamps.sched.predictors import LearnedPredictor, NoisyPredictor, OraclePredictor
from flexlamps.sched.request import RequestSpec
from flexlamps.sched.scheduler import SchedulerConfig
from flexlamps.sim.metrics import Summary, summarize
from flexlamps.sched.records import RequestRecord
from flexlamps.sim.simulator import Simulator


@dataclass
class RunResult:
    summary: Summary
    records: list[RequestRecord]
    simulator: Simulator


def make_predictor(kind: str, specs: list[RequestSpec], noise_sigma: float = 0.0, seed: int = 0):
    if kind == "oracle":
        base = OraclePredictor({s.request_id: s for s in specs})
    elif kind == "learned":
        base = LearnedPredictor()
    else:
        raise ValueError(f"unknown predictor {kind!r}; choose oracle or learned")
    return NoisyPredictor(base, noise_sigma, seed) if noise_sigma > 0 else base


def run_policy(specs: list[RequestSpec], policy: str, qps: float, cost: CostModel | None = None,
               predictor: str = "oracle", noise_sigma: float = 0.0, seed: int = 0,
               config: SchedulerConfig | None = None, on_iteration=None,
               policy_kwargs: dict | None = None) -> RunResult:
    cost = cost or CostModel.gptj6b_a100()
    sim = Simulator(specs, make_policy(policy, **(policy_kwargs or {})),
                    make_predictor(predictor, specs, noise_sigma, seed), cost, config, on_iteration)
    t0 = time.perf_counter()
    records = sim.run()
    wall = time.perf_counter() - t0
    return RunResult(summarize(records, policy, qps, sim.stats.end_time, wall), records, sim)
