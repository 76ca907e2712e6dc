"""One real-engine run of augmented requests under one policy, from plain settings.

Builds, from one `AgentsConfig` and an executor: the paged cache (pools sized in blocks from byte
budgets, given, or what the tiers' budgets leave on an offload executor: `LLM.prepare_augmented`), the Scheduler
with the same block counts, a CostModel measured on this machine (once per model, shared by
every policy so they all price strategies alike), the policy and predictor, and runs the
AugmentedEngine over any executor.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from flexlamps.engine.augmented.calibrate import calibrate_cost_model
from flexlamps.engine.augmented.engine import AugmentedEngine, AugmentedResult, WallClock
from flexlamps.engine.caches.paged_state import paged_state_blocks
from flexlamps.workloads.tokenized import TokenizedRequest
from flexlamps.engine.executors.contract import Executor, PagedCache
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import SchedulingPolicy, make_policy
from flexlamps.sched.predictors import NoisyPredictor, OraclePredictor
from flexlamps.sched.scheduler import Scheduler, SchedulerConfig


@dataclass(frozen=True, kw_only=True)
class AgentsConfig:
    gpu_kv_bytes: int  # the gpu tier's KV pool
    cpu_swap_bytes: int  # the cpu tier's swap pool
    block_size: int = 16  # tokens per block
    max_num_seqs: int = 16  # requests in one iteration
    max_num_batched_tokens: int = 256  # tokens in one iteration (prefill chunks are cut to fit)
    noise_sigma: float = 0.0  # multiplicative noise on the oracle's predictions
    seed: int = 0

    def __post_init__(self):
        if self.gpu_kv_bytes <= 0 or self.cpu_swap_bytes < 0:
            raise ValueError(f"gpu_kv_bytes must be > 0 and cpu_swap_bytes >= 0, got "
                             f"{self.gpu_kv_bytes} and {self.cpu_swap_bytes}")
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")

    def to_json(self) -> dict:
        return asdict(self)


def new_cache(executor: Executor, config: AgentsConfig) -> PagedCache:
    per_block = config.block_size * executor.cfg.kv_bytes_per_token(executor.dtype.itemsize)
    gpu, cpu = config.gpu_kv_bytes // per_block, config.cpu_swap_bytes // per_block
    state = paged_state_blocks(executor.cfg, config.block_size, executor.dtype)  # a hybrid model's, per request
    if gpu < 1 + state:
        raise ValueError(f"gpu KV budget of {config.gpu_kv_bytes} bytes holds {gpu} blocks of {config.block_size} "
                         f"tokens ({per_block} bytes each); one request needs {1 + state}"
                         + (f" (its recurrent state takes {state})" if state else "") + "; raise --gpu-kv-mem")
    return executor.new_paged_cache(gpu, cpu, config.block_size)


def measure_cost(executor: Executor, config: AgentsConfig, max_model_len: int, cpu_clock: bool = False) -> CostModel:
    """The CostModel of this machine, timed on the clock the run will use, with iterations no
    larger than the run's (so they fit the working set the pools were sized beside)."""
    cache = new_cache(executor, config)
    try:
        return calibrate_cost_model(executor, cache, max_model_len, batch=min(8, max(2, config.max_num_seqs)),
                                    chunk=min(64, config.max_num_batched_tokens),
                                    timer=time.process_time if cpu_clock else time.perf_counter)
    finally:
        cache.release()


def run_policy_on_engine(executor: Executor, requests: list[TokenizedRequest], policy: str | SchedulingPolicy, config: AgentsConfig,
                         cost: CostModel, *, clock=None, check: bool = False,
                         on_iteration=None, on_finish=None, policy_kwargs: dict | None = None,
                         predictor=None, calls=None) -> AugmentedResult:
    """Run `requests` under `policy`; the result carries each tier's peak during this run.
    `predictor`: default the oracle of the requests' specs (noisy with `config.noise_sigma`);
    `calls`: what the requests do between tokens (default their trace segments)."""
    cache = new_cache(executor, config)
    try:
        sched_cfg = SchedulerConfig(cache.num_gpu_blocks, cache.num_cpu_blocks, config.block_size,
                                    state_blocks=getattr(cache, "state_blocks", 0),
                                    max_blocks=getattr(cache, "ring_blocks", None),
                                    max_num_seqs=config.max_num_seqs,
                                    max_num_batched_tokens=config.max_num_batched_tokens)
        if predictor is None:
            predictor = OraclePredictor({r.spec.request_id: r.spec for r in requests})
            if config.noise_sigma > 0:
                predictor = NoisyPredictor(predictor, config.noise_sigma, config.seed)
        if not isinstance(policy, SchedulingPolicy):
            policy = make_policy(policy, **(policy_kwargs or {}))
        sched = Scheduler(sched_cfg, policy, predictor, cost)
        executor.reset_peaks()
        engine = AugmentedEngine(executor, cache, sched, clock or WallClock(), check, on_iteration, on_finish,
                                 calls)
        result = engine.run(requests)
        result.tier_use = executor.tier_use()
        return result
    finally:
        cache.release()
