"""Augmented-request scheduling (pure Python, no torch): requests with API-call pauses, a
block manager over gpu / cpu tiers, interception strategies, policies and predictors."""

from flexlamps.sched.block_manager import BlockManager
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.output import RunnerOutput, SchedulerOutput
from flexlamps.sched.policies import POLICIES, SchedulingPolicy, make_policy
from flexlamps.sched.predictors import LearnedPredictor, NoisyPredictor, OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment, Status, Strategy
from flexlamps.sched.scheduler import Scheduler, SchedulerConfig

__all__ = [
    "BlockManager", "CostModel", "RunnerOutput", "SchedulerOutput", "POLICIES", "SchedulingPolicy",
    "make_policy", "LearnedPredictor", "NoisyPredictor", "OraclePredictor", "Request",
    "RequestSpec", "Segment", "Status", "Strategy", "Scheduler", "SchedulerConfig",
]
