"""A dense, preallocated MLA latent cache in one device's memory: the in-memory sparse path.

Per layer and slot it holds one record per token: the latent (kv_lora_rank) with the rotary
key (qk_rope_head_dim), and, for DeepSeek-V3.2, the indexer key (index_head_dim). Records are
either the values in the compute dtype or, with `fp8=True`, ESS's FP8 layout (656 B latent
records and 132 B indexer keys for DeepSeek-V3.2; see `quant.fp8.LatentRecords`).

A step of more than one token per row (prefill) attends over the whole visible span with the
top-k selection as a mask; a decode step (one token per row) scores the indexer keys, gathers
only the selected records and attends over those — the path the offloaded latent cache
reproduces bit for bit.
"""

from __future__ import annotations

import torch

from flexlamps.engine.caches.latent_offload import OffloadedLatentCache
from flexlamps.engine.caches.latent_pool import LatentPool
from flexlamps.engine.caches.latent_records import record_formats
from flexlamps.models.blocks.mla import (MLAStep, gather_entries, index_scores, latent_attention,
                                  select_topk, topk_mask, visible_mask)
from flexlamps.models.config import ModelConfig
from placement.ess import pool_entries


class DenseLatentCache:
    packs_rows = False  # one sequence a row (the indexer's top-k is per sequence)
    rewinds = True  # a row may be fed again from an earlier position

    def __init__(self, cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", *, fp8: bool = False, budget=None):
        """`budget`: the TierBudget of the tier `device` stands for, charged for the tables
        (the offload executor's gpu tier); None charges nothing (the in-memory executor)."""
        if cfg.mla is None:
            raise ValueError(f"a latent cache needs an MLA model, got model_type {cfg.model_type!r}")
        self.dtype = dtype
        self.latent_format, self.key_format = record_formats(cfg, dtype, fp8)

        def table(fmt) -> list[torch.Tensor]:
            if fmt is None:
                return []
            return [torch.zeros((num_slots, capacity, fmt.record_len), dtype=fmt.storage_dtype, device=device)
                    for _ in range(cfg.num_layers)]

        self.capacity = capacity
        self.num_slots = num_slots
        self.budget, self._charged = budget, 0
        if budget is not None:
            per_token = self.latent_format.record_bytes + (self.key_format.record_bytes if self.key_format else 0)
            self._charged = num_slots * capacity * cfg.num_layers * per_token
            budget.allocate(self._charged, "latent cache (all layers)")
        self.entries = table(self.latent_format)
        self.index_keys = table(self.key_format)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.entries + self.index_keys)

    def release(self) -> None:
        if self._charged:
            self.budget.free(self._charged)
            self._charged = 0
        self.entries, self.index_keys = [], []

    def copy_prefix_from(self, src: "DenseLatentCache", length: int, slots: torch.Tensor) -> None:
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes)."""
        for mine, theirs in ((self.entries, src.entries), (self.index_keys, src.index_keys)):
            for layer in range(len(mine)):
                mine[layer][slots, :length] = theirs[layer][0, :length]

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor):
        """The `attend(step)` callback for one layer of one step (see models.deepseek)."""
        return lambda step: self.attend(layer, slots, positions, step)

    def _entries(self, records: torch.Tensor) -> torch.Tensor:
        """Records as `latent_attention` takes them: (..., R + r) in the compute dtype."""
        return self.latent_format.entries(records, self.dtype)

    def attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, step: MLAStep) -> torch.Tensor:
        device = self.entries[layer].device  # the offload executor hands the step's rows over from the CPU
        slots, positions = slots.to(device), positions.to(device)
        rows = slots[:, None]
        self.entries[layer][rows, positions] = self.latent_format.pack(step.latent, step.k_rope)
        if step.is_sparse:
            self.index_keys[layer][rows, positions] = self.key_format.pack(step.index_k)
        span = int(positions.max()) + 1
        records = self.entries[layer][slots, :span]
        visible = visible_mask(positions, span)
        if not step.is_sparse:
            return latent_attention(step, self._entries(records), visible)
        keys = self.key_format.unpack(self.index_keys[layer][slots, :span], self.dtype)[0]
        scores = index_scores(step, keys)
        if positions.shape[1] > 1:
            return latent_attention(step, self._entries(records), topk_mask(scores, visible, step.index_topk))
        indices, valid = select_topk(scores, visible, step.index_topk)  # (n, 1, k)
        return latent_attention(step, self._entries(gather_entries(records, indices[:, 0])), valid)


def new_latent_cache(cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype, *,
                     gpu_fraction: float, budgets: dict, device: torch.device, fp8: bool = False,
                     layer_fractions: tuple[float, ...] = (), overlap_misses: bool = False):
    """The offload executor's latent cache: all on the gpu tier when the policy puts the whole
    cache there (or the model has no indexer to select with), else ESS's layout with each
    layer's gpu pool holding its share of the context (`layer_fractions`, the planner's
    per-layer pools; empty: `gpu_fraction` for every layer), at least one step's top-k;
    `overlap_misses`: its decode copies the misses while attending over the hits (not bit-exact:
    `latent_offload.OVERLAP_LOGIT_TOLERANCE`)."""
    if not is_offloaded(cfg, gpu_fraction):
        return DenseLatentCache(cfg, num_slots, capacity, dtype, device, fp8=fp8, budget=budgets["gpu"])
    pools = pool_sizes(cfg, capacity, gpu_fraction, layer_fractions)
    return OffloadedLatentCache(cfg, num_slots, capacity, dtype, budgets, device, pools, fp8=fp8,
                                overlap=overlap_misses)


def is_offloaded(cfg: ModelConfig, gpu_fraction: float) -> bool:
    """Whether `new_latent_cache` lays the cache out as ESS does (cpu records, gpu pools)."""
    if gpu_fraction >= 1.0:
        return False
    if not cfg.mla.has_indexer:
        raise ValueError(f"{cfg.model_type} attends to every cached entry, so its latent cache stays on "
                         "the gpu tier; give it the gpu memory (--gpu-mem) or a policy with cache gpu 1")
    return True


def pool_sizes(cfg: ModelConfig, capacity: int, gpu_fraction: float,
               layer_fractions: tuple[float, ...] = ()) -> list[int]:
    """Each layer's pool entries per slot for a policy's cache fraction or per-layer pools."""
    fractions = layer_fractions or (gpu_fraction,) * cfg.num_layers
    if len(fractions) != cfg.num_layers:
        raise ValueError(f"the policy's latent_pools has {len(fractions)} layers, the model {cfg.num_layers}")
    return [pool_entries(cfg.mla.index_topk, fraction, capacity) for fraction in fractions]


def latent_cache_bytes(cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype, *,
                       gpu_fraction: float, layer_fractions: tuple[float, ...] = (),
                       fp8: bool = False) -> dict[str, int]:
    """Bytes `new_latent_cache` charges each tier for these arguments, allocating nothing (the
    dry run's): the records in the compute dtype or ESS's FP8 layout (656 B a token and layer
    for DeepSeek-V3.2), the indexer keys, and with offload each layer's pool and its books."""
    latent, keys = record_formats(cfg, dtype, fp8)
    key_bytes = keys.record_bytes if keys is not None else 0
    table = num_slots * capacity  # records per layer
    if not is_offloaded(cfg, gpu_fraction):
        return {"gpu": cfg.num_layers * table * (latent.record_bytes + key_bytes), "cpu": 0}
    pools = pool_sizes(cfg, capacity, gpu_fraction, layer_fractions)
    gpu = sum(table * key_bytes + LatentPool.bytes_for(num_slots, capacity, min(p, capacity), latent.record_bytes)
              for p in pools)
    return {"gpu": gpu, "cpu": cfg.num_layers * table * latent.record_bytes}


def latent_staged_bytes(cfg: ModelConfig, num_rows: int, num_queries: int, span: int, dtype: torch.dtype, *,
                        offloaded: bool, fp8: bool = False) -> int:
    """Most gpu bytes an offloaded latent cache holds for one call's records besides its tables:
    a prefill stages the rows' whole span, a decode copies in at most one top-k of misses a row.
    A latent cache on the gpu tier stages nothing."""
    if not offloaded:
        return 0
    record = record_formats(cfg, dtype, fp8)[0].record_bytes
    entries = span if num_queries > 1 else min(cfg.mla.index_topk, span)
    return num_rows * entries * record
