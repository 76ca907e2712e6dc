"""The scheduler's sizes: the paged pools' blocks on each tier and the per-iteration limits."""

from __future__ import annotations

from dataclasses import dataclass

from flexlamps.sched.cost_model import CostModel


@dataclass
class SchedulerConfig:
    num_gpu_blocks: int
    num_cpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    watermark: float = 0.01  # fraction of gpu blocks kept free at admission (vLLM's default)
    state_blocks: int = 0  # blocks a request's recurrent state takes (a hybrid model's; BlockManager)
    max_blocks: int | None = None  # KV blocks a request holds at most (a paged cache's ring); None: no cap

    @classmethod
    def from_cost_model(cls, cost: CostModel, block_size: int = 16, **kw) -> "SchedulerConfig":
        return cls(cost.gpu_kv_tokens // block_size, cost.cpu_swap_tokens // block_size, block_size, **kw)

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: dict) -> "SchedulerConfig":
        return cls(**d)
