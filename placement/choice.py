"""The discrete part of a policy (`Choice`) and the affine terms the cost model builds for it (`CostTerms`)."""

from dataclasses import dataclass, field

import numpy as np

from placement.affine import Affine, C_GPU
from placement.latent_pools import MissEnvelope
from placement.staging import WeightStaging
from placement.specs import CompressionSpec, EngineCapabilities, Policy


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The discrete part of a policy: what the search enumerates and the LP holds fixed."""

    gpu_batch_size: int
    num_gpu_batches: int
    compress_weight: bool = False
    compress_cache: bool = False
    cpu_attention: bool = False
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    merge_decode: bool = True
    # a sparse-attention MLA model's latent cache in ESS's layout: all of it on the cpu tier,
    # per layer a gpu pool (what c_gpu measures), misses copied each step (`placement.latent_pools`)
    latent_pools: bool = False
    # the engine's switch for 4-bit weights (`EngineCapabilities.int4_in_place_below_rows`)
    int4_in_place_below_rows: int = EngineCapabilities().int4_in_place_below_rows
    # whether the machine has the fused 4-bit kernel for the model's dtype (`int4_runs_in_place`;
    # set from the hardware by `build_terms`): without it every call dequantizes
    int4_kernel: bool = True
    # a MoE layer's cpu-tier experts run on the CPU below this many tokens per expert
    # (`Policy.cpu_expert_tokens`); None: the planner's own switch for the machine (`build_terms`)
    cpu_expert_tokens: int | None = None
    # the share of a decode step's reads of cached-kind experts (off disk; beside a GPU, copies off
    # the cpu tier too) the engine's expert cache serves (`placement.expert_cache_terms`)
    expert_hits: float = 0.0
    # the disk fraction holds routed experts only, each read as routed: the engine places a MoE
    # layer's dense parts and the head on the faster tiers first (set where the fractions allow it)
    disk_experts_only: bool = False
    # a MoE layer's routed experts staged at once, at most (`Policy.expert_group`; 0: all a sweep picks)
    expert_group: int = 0

    @classmethod
    def of(cls, policy: Policy) -> "Choice":
        return cls(gpu_batch_size=policy.gpu_batch_size, num_gpu_batches=policy.num_gpu_batches,
                   compress_weight=policy.compress_weight, compress_cache=policy.compress_cache,
                   cpu_attention=policy.cpu_attention, compression=policy.compression,
                   merge_decode=policy.merge_decode, latent_pools=policy.cache.gpu < 1,
                   cpu_expert_tokens=policy.cpu_expert_tokens, expert_group=policy.expert_group)

    def decode_calls(self) -> tuple[int, int]:
        """(calls, rows per call) a layer runs per decode step: the block merged, or each
        micro-batch in turn."""
        if self.merge_decode:
            return 1, self.gpu_batch_size * self.num_gpu_batches
        return self.num_gpu_batches, self.gpu_batch_size


@dataclass(slots=True)
class CostTerms:
    """Affine per-layer times (seconds) and peak memory rows (bytes) for one `Choice`."""

    prefill: dict[str, Affine]  # PREFILL_TERMS
    decode: dict[str, Affine]  # DECODE_TERMS
    memory: dict[str, Affine]  # MEMORY_ROWS (a MoE model's gpu rows less `staging`'s `extra`: a lower bound)
    num_layers: int
    num_decode_steps: int  # gen_len - 1
    tokens_per_block: int  # block size * gen_len
    cache_gpu_bounds: tuple[float, float] = (0.0, 1.0)  # what the engine can run for c_gpu
    latent: "LatentTerms | None" = None  # the pools' misses, for `Choice.latent_pools`
    cpu_expert_tokens: int = 0  # the switch priced (`Choice.cpu_expert_tokens`), for the plan's policy
    # the output head's rows the gpu_head row stages (bytes, the engine's one chunk) and its vocab rows:
    # nothing is staged where the fractions keep every row on the gpu tier (`memory_at`)
    head_staged: tuple[float, int] = (0.0, 1)
    staging: WeightStaging | None = None  # a MoE layer's staged weights beyond the rows' chord, one branch

    def memory_value(self, row: str, x: np.ndarray) -> float:
        """Memory row `row`'s bytes at fractions `x`, a MoE layer's staging exactly as the engine charges it."""
        return self.memory[row](x) + (self.staging.extra(row, x) if self.staging is not None else 0.0)


@dataclass(frozen=True, slots=True)
class LatentTerms:
    """Decode copies of an offloaded latent cache's misses: with m the mean misses per layer
    (a fraction of the top-k, per sequence per step), they add `m * decode_s_per_miss[term]`
    to each decode term; m >= the envelope of the layers' miss curves at c_gpu."""

    envelope: MissEnvelope
    decode_s_per_miss: dict[str, float]
    pools: tuple[float, ...] = ()  # given per-layer pools (a policy's); empty: the best split of c_gpu

    def misses(self, x: np.ndarray) -> float:
        if self.pools:
            return self.envelope.misses_at(self.pools)
        return self.envelope.value(float(x[C_GPU]))
