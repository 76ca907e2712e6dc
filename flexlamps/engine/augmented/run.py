"""One real-engine run of augmented requests under one policy, from plain settings.

Builds, from one `AgentsConfig`: the paged cache (pools sized in blocks from byte budgets, given
or derived from the tiers' budgets by the placement planner, `AgentsConfig.from_tier_budgets`),
the Scheduler with the same block counts, a CostModel measured on this machine (once per
model, shared by every policy so they all price strategies alike), the policy and predictor,
and runs the AugmentedEngine.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass

import torch

import placement

from flexlamps.engine.augmented.engine import AugmentedEngine, AugmentedResult, WallClock
from flexlamps.engine.augmented.calibrate import calibrate_cost_model
from flexlamps.engine.augmented.workload import TokenizedRequest, TraceScale, scale_spec, tokenize_requests
from flexlamps.engine.augmented.kv_pools import kv_pools
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import Policy, make_policy
from flexlamps.sched.predictors import NoisyPredictor, OraclePredictor
from flexlamps.sched.scheduler import Scheduler, SchedulerConfig
from flexlamps.sim.trace import Template, load_templates, replay

_PLACEMENT_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True, kw_only=True)
class AgentsConfig:
    gpu_kv_bytes: int  # the gpu tier's KV pool (the placement plan's cache share)
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

    @classmethod
    def from_tier_budgets(cls, llm, *, gpu_mem_bytes: int, cpu_mem_bytes: int, max_context: int,
                          **settings) -> "AgentsConfig":
        """Pools sized by the placement planner from the tiers' byte budgets (`kv_pools`): the
        gpu pool is what the gpu budget leaves once the weights and working set are in, the
        swap pool what the cpu budget leaves. `settings`: the other AgentsConfig fields."""
        config = cls(gpu_kv_bytes=1, cpu_swap_bytes=0, **settings)  # validates the settings
        model = dataclasses.replace(placement.ModelSpec.from_hf_config(llm.reader.hf_config),
                                    dtype=_PLACEMENT_DTYPES[llm.dtype])
        pools = kv_pools(model, gpu_mem_bytes=gpu_mem_bytes, cpu_mem_bytes=cpu_mem_bytes,
                         max_num_seqs=config.max_num_seqs, max_context=max_context,
                         max_num_batched_tokens=config.max_num_batched_tokens)
        return dataclasses.replace(config, gpu_kv_bytes=pools.gpu_kv_bytes, cpu_swap_bytes=pools.cpu_swap_bytes)


def new_cache(llm, config: AgentsConfig) -> PagedKVCache:
    cfg, dtype = llm.config, llm.dtype
    gpu = PagedKVCache.blocks_in(cfg, config.gpu_kv_bytes, config.block_size, dtype)
    cpu = PagedKVCache.blocks_in(cfg, config.cpu_swap_bytes, config.block_size, dtype)
    if gpu < 1:
        need = PagedKVCache.blocks_in(cfg, 1 << 40, config.block_size, dtype)
        raise ValueError(f"gpu KV budget of {config.gpu_kv_bytes} bytes holds no block of {config.block_size} "
                         f"tokens ({(1 << 40) // need} bytes each); raise --gpu-kv-mem")
    return PagedKVCache(cfg, gpu, cpu, config.block_size, dtype, llm.executor.device)


def measure_cost(llm, config: AgentsConfig, max_model_len: int, cpu_clock: bool = False) -> CostModel:
    """The CostModel of this machine, timed on the clock the run will use."""
    return calibrate_cost_model(llm.executor, new_cache(llm, config), max_model_len,
                                timer=time.process_time if cpu_clock else time.perf_counter)


def run_policy_on_engine(llm, requests: list[TokenizedRequest], policy: str | Policy, config: AgentsConfig,
                         cost: CostModel, *, clock=None, check: bool = False,
                         on_iteration=None, on_finish=None, policy_kwargs: dict | None = None) -> AugmentedResult:
    cache = new_cache(llm, config)
    sched_cfg = SchedulerConfig(cache.num_gpu_blocks, cache.num_cpu_blocks, config.block_size,
                                max_num_seqs=config.max_num_seqs,
                                max_num_batched_tokens=config.max_num_batched_tokens)
    predictor = OraclePredictor({r.spec.request_id: r.spec for r in requests})
    if config.noise_sigma > 0:
        predictor = NoisyPredictor(predictor, config.noise_sigma, config.seed)
    if not isinstance(policy, Policy):
        policy = make_policy(policy, **(policy_kwargs or {}))
    sched = Scheduler(sched_cfg, policy, predictor, cost)
    engine = AugmentedEngine(llm.executor, cache, sched, clock or WallClock(), check, on_iteration, on_finish)
    return engine.run(requests)


def load_trace(llm, trace_path: str) -> list[Template]:
    """Trace templates, text segments counted with the model's tokenizer (not capped: the
    TraceScale caps them)."""
    return load_templates(trace_path, lambda text: len(llm.tokenizer.encode(text)), max_model_len=1 << 30)


def replay_requests(llm, templates: list[Template], scale: TraceScale, qps: float, num_requests: int,
                    seed: int = 0) -> list[TokenizedRequest]:
    """`num_requests` drawn from `templates` with Poisson arrivals at `qps`, scaled, with ids."""
    cfg = llm.config
    special = set(cfg.eos_token_ids) | ({cfg.bos_token_id} if cfg.bos_token_id is not None else set())
    specs = [scale_spec(s, scale) for s in replay(templates, qps, seed=seed, num_requests=num_requests)]
    return tokenize_requests(specs, cfg.vocab_size, special)
