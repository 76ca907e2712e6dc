"""Latency-vs-load sweeps in steady state and the load where a policy saturates.

A policy saturates at the highest load whose replay passes the window test
(`steady.steady_state`): loads of a grid are run in increasing order until one fails, then the
gap between the last stable and the first unstable load is bisected `refine` times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.scheduler import SchedulerConfig
from flexlamps.sim.run import run_policy
from flexlamps.sim.steady import COOLDOWN, WARMUP, SteadyState, steady_state
from flexlamps.workloads.trace import Template, replay


@dataclass(frozen=True)
class Setting:
    """Everything a steady-state point depends on besides the policy and the load."""

    cost: CostModel
    config: SchedulerConfig
    window: float = 300.0  # replay: 4 x qps x window requests (arrivals span 4 x window s)
    seed: int = 0
    predictor: str = "oracle"
    noise_sigma: float = 0.0
    warmup: float = WARMUP
    cooldown: float = COOLDOWN
    policy_kwargs: dict = field(default_factory=dict)  # policy name -> its keyword arguments


def measure(templates: list[Template], policy: str, qps: float, setting: Setting) -> SteadyState:
    specs = replay(templates, qps, setting.window, setting.seed)
    res = run_policy(specs, policy, qps, setting.cost, setting.predictor, setting.noise_sigma,
                     setting.seed, setting.config,
                     policy_kwargs=setting.policy_kwargs.get(policy))
    return steady_state(res.records, policy, qps, setting.warmup, setting.cooldown,
                        res.summary.sim_seconds)


def saturation(templates: list[Template], policy: str, grid: list[float], setting: Setting,
               refine: int = 3, on_point=None) -> tuple[float | None, dict[float, SteadyState]]:
    """(highest stable load found, {load: point}); None when the lowest load is unstable.
    The grid runs in increasing order and stops at its first unstable load."""
    points: dict[float, SteadyState] = {}

    def run(q: float) -> SteadyState:
        points[q] = measure(templates, policy, q, setting)
        if on_point is not None:
            on_point(points[q])
        return points[q]

    last_ok, first_bad = None, None
    for q in sorted(grid):
        if run(q).stable:
            last_ok = q
        else:
            first_bad = q
            break
    if last_ok is None or first_bad is None:
        return last_ok, points
    for _ in range(refine):
        mid = round((last_ok + first_bad) / 2, 3)
        if mid in (last_ok, first_bad):
            break
        if run(mid).stable:
            last_ok = mid
        else:
            first_bad = mid
    return last_ok, points
