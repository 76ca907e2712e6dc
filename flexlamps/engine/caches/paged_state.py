"""The paged cache of a hybrid model (Qwen3-Next, Qwen3.5) for the augmented face: KV blocks for
its full-attention layers and, in blocks of the same pool, each request's DeltaNet state.

A block is `block_bytes` raw bytes: the K and V of `block_size` tokens over the full-attention
layers (viewed as PagedKVCache's per-layer tensors), or a piece of one request's state. A request
with any cached token owns `state_blocks` blocks first (its table's head) and then its KV blocks,
so the scheduler's BlockManager counts, swaps and frees the state as it does KV blocks: a state
preserved through an API call keeps its blocks, a swapped one travels to the cpu pool with the
request's KV blocks in the same copies, a discarded one is freed and rebuilt from position 0 by the
recomputation (`sched.block_manager`, `state_blocks`).

A request's state bytes: the number of tokens the state has seen (int64; the same check as
caches.state, so a step that neither starts nor continues a row's state is refused), then per
DeltaNet layer the parts caches.state keeps (conv window, recurrent matrices at the last chunk
boundary, the open chunk's k | v | beta and g), each 8-byte aligned. Blocks handed back are zeroed, so a granted block's state reads as zero tokens seen.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Sequence

import torch

from flexlamps.engine.caches.hybrid import HybridGeometry, kv_view
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.engine.caches.state import StateStepRows
from flexlamps.engine.executors.step import Segments
from flexlamps.models.blocks.aligned_delta_rule import OpenChunk
from flexlamps.models.config import ModelConfig
from flexlamps.models.hybrid_config import DELTA_RULE_CHUNK

_HEADER = 8  # int64: tokens the state has seen


def _aligned(n: int) -> int:
    return -(-n // 8) * 8


def state_parts(cfg: ModelConfig, dtype: torch.dtype) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of one row's parts of one DeltaNet layer's state, in caches.state's order."""
    hy = cfg.hybrid
    return [((hy.conv_dim, hy.conv_kernel - 1), dtype),
            ((hy.num_value_heads, hy.key_head_dim, hy.value_head_dim), torch.float32),
            ((DELTA_RULE_CHUNK - 1, hy.key_dim + hy.value_dim + hy.num_value_heads), dtype),
            ((DELTA_RULE_CHUNK - 1, hy.num_value_heads), torch.float32)]


def state_regions(cfg: ModelConfig, dtype: torch.dtype) -> tuple[list[list[tuple[int, int]]], int]:
    """Per DeltaNet layer, per part (`state_parts`), its (offset, bytes) in a request's state bytes;
    and the total, header included."""
    at, regions = _HEADER, []
    for _ in cfg.hybrid.linear_layers:
        layer = []
        for shape, part_dtype in state_parts(cfg, dtype):
            nbytes = math.prod(shape) * torch.empty((), dtype=part_dtype).element_size()
            layer.append((at, nbytes))
            at += _aligned(nbytes)
        regions.append(layer)
    return regions, at


def paged_state_blocks(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Blocks of `block_size` tokens' KV bytes one request's DeltaNet state takes (0: no state)."""
    if cfg.hybrid is None:
        return 0
    block_bytes = block_size * cfg.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
    return -(-state_regions(cfg, dtype)[1] // block_bytes)


class HybridPagedCache(PagedKVCache):
    packs_rows = False  # a recurrent state holds one sequence
    rewinds = False  # a row fed again from an earlier position would need the state there

    def __init__(self, cfg: ModelConfig, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", budgets: dict | None = None):
        if cfg.hybrid is None:
            raise ValueError(f"{cfg.model_type} has no DeltaNet layers; its paged cache is PagedKVCache")
        self.full_cfg = cfg
        self.regions, self.state_bytes = state_regions(cfg, dtype)
        self.parts = state_parts(cfg, dtype)
        super().__init__(kv_view(cfg), num_gpu_blocks, num_cpu_blocks, block_size, dtype, device, budgets)
        self.state_blocks = -(-self.state_bytes // self.block_bytes)
        hy = cfg.hybrid
        self._where = {i: ("state", hy.linear_layers.index(i)) if hy.is_linear(i) else ("kv", hy.full_layers.index(i))
                       for i in range(cfg.num_layers)}
        self._state_tables = torch.zeros((0, self.state_blocks), dtype=torch.long, device=self.device)
        self.checks_state = True

    def _new_pools(self) -> tuple[list, list, list, list]:
        """One raw byte row per block (so a block holds KV or state), viewed per KV layer."""
        if self.block_bytes % 8:
            raise ValueError(f"a block of {self.block_bytes} bytes cannot hold 8-byte aligned states; "
                             "use an even block size")
        self.raw = torch.zeros((self.num_gpu_blocks, self.block_bytes), dtype=torch.uint8, device=self.device)
        self.raw_cpu = torch.zeros((self.num_cpu_blocks, self.block_bytes), dtype=torch.uint8)
        cfg, size = self.cfg, torch.empty((), dtype=self.dtype).element_size()
        shape = (cfg.num_kv_heads, self.block_size, cfg.head_dim)
        part = shape[0] * shape[1] * shape[2] * size  # one layer's K (or V) of a block

        def views(raw: torch.Tensor, which: int) -> list[torch.Tensor]:
            return [raw[:, (2 * i + which) * part:(2 * i + which + 1) * part].view(self.dtype).view(len(raw), *shape)
                    for i in range(cfg.num_layers)]
        return views(self.raw, 0), views(self.raw, 1), views(self.raw_cpu, 0), views(self.raw_cpu, 1)

    @property
    def gpu_pool_bytes(self) -> int:
        return self.raw.nbytes

    @property
    def cpu_pool_bytes(self) -> int:
        return self.raw_cpu.nbytes

    # -- moves: whole blocks, KV and state alike ----------------------------------------------------
    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        if pairs:
            gpu, cpu = torch.tensor([g for g, _ in pairs], device=self.device), torch.tensor([c for _, c in pairs])
            self.raw_cpu[cpu] = self.raw[gpu].to("cpu")

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        if pairs:
            cpu, gpu = torch.tensor([c for c, _ in pairs]), torch.tensor([g for _, g in pairs], device=self.device)
            self.raw[gpu] = self.raw_cpu[cpu].to(self.device)

    def free_blocks(self, gpu_blocks: Sequence[int] = ()) -> None:
        """Zeroed: masked keys stay finite and a state block regranted reads as zero tokens seen."""
        if gpu_blocks:
            self.raw[torch.tensor(list(gpu_blocks), device=self.device)] = 0

    # -- a step ------------------------------------------------------------------------------------
    def set_block_tables(self, tables: Sequence[Sequence[int]]) -> torch.Tensor:
        """Each table: the request's `state_blocks` state blocks, then its KV blocks."""
        s = self.state_blocks
        short = [i for i, t in enumerate(tables) if len(t) <= s]
        if short:
            raise ValueError(f"block table {short[0]} has {len(tables[short[0]])} blocks; a hybrid model's row "
                             f"needs its {s} state blocks and at least one KV block")
        self._state_tables = torch.tensor([list(t[:s]) for t in tables], dtype=torch.long,
                                          device=self.device).reshape(len(tables), s)
        return super().set_block_tables([t[s:] for t in tables])

    def step_geometry(self, slots: torch.Tensor, positions: torch.Tensor, segments: Segments | None = None,
                      lengths: torch.Tensor | None = None) -> HybridGeometry:
        if segments is not None:
            raise ValueError("packed rows (several sequences in one cache row) cannot share a recurrent state")
        ids = self._state_tables[slots]
        start, t = positions[:, 0].cpu(), positions.shape[1]
        held = self._read(ids, 0, _HEADER).view(torch.int64)[:, 0].cpu()
        fresh = start == 0
        stale = ~fresh & (start != held)
        if self.checks_state and bool(stale.any()):
            i = int(stale.nonzero()[0, 0])
            raise ValueError(f"step row {i} holds the recurrent state of {int(held[i])} tokens; a step from position "
                             f"{int(start[i])} can neither continue it nor start anew (recompute from position 0)")
        fed = torch.full_like(start, t) if lengths is None else lengths.cpu().to(torch.long)
        self._write(ids, 0, (start + fed).to(self.device)[:, None].view(torch.uint8))
        rows = StateStepRows(ids, fresh, None if lengths is None else lengths.cpu(), torch.where(fresh, 0, start))
        kv = super().step_geometry(slots, positions, lengths=lengths)  # pads are never written
        return HybridGeometry(kv, rows, kv.span)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
                  geometry: HybridGeometry | None = None):
        if geometry is None:
            raise ValueError("HybridPagedCache.attend_fn needs the step's geometry (step_geometry, once per step)")
        kind, index = self._where[layer]
        if kind == "state":
            return PagedStateAccess(self, index, geometry.state)
        return super().attend_fn(index, slots, positions, geometry.kv)

    # -- a request's state bytes, spread over its state blocks --------------------------------------
    def _pieces(self, offset: int, nbytes: int):
        """(state block, first byte, end byte, offset in the region) of a byte region."""
        b = self.block_bytes
        for k in range(offset // b, (offset + nbytes - 1) // b + 1):
            lo, hi = max(offset, k * b), min(offset + nbytes, (k + 1) * b)
            yield k, lo - k * b, hi - k * b, lo - offset

    def _read(self, ids: torch.Tensor, offset: int, nbytes: int) -> torch.Tensor:
        return torch.cat([self.raw[ids[:, k], a:z] for k, a, z, _ in self._pieces(offset, nbytes)], dim=1)

    def _write(self, ids: torch.Tensor, offset: int, data: torch.Tensor) -> None:
        for k, a, z, at in self._pieces(offset, data.shape[1]):
            self.raw[ids[:, k], a:z] = data[:, at:at + z - a]


class PagedStateAccess:
    """One DeltaNet layer's rows of one step (models.blocks.deltanet_layer.StateAccess); `rows.slots`
    holds each row's state blocks."""

    def __init__(self, cache: HybridPagedCache, layer: int, rows: StateStepRows):
        self.cache, self.rows, self.lengths = cache, rows, rows.lengths
        self.regions = cache.regions[layer]
        self._read: list[torch.Tensor | None] = [None] * len(cache.parts)  # the parts as read() handed them out

    def read(self) -> tuple[torch.Tensor, torch.Tensor, OpenChunk]:
        cache, ids = self.cache, self.rows.slots
        keep = ~self.rows.fresh.to(cache.device)
        parts = []
        for (offset, nbytes), (shape, dtype) in zip(self.regions, cache.parts):
            part = cache._read(ids, offset, nbytes).view(dtype).view(len(ids), *shape)
            parts.append(torch.where(keep.view(-1, *[1] * len(shape)), part, 0))
        # a part handed back as read holds what the blocks hold, unless a row starts anew (its
        # zeros must reach the blocks, which may hold a discarded state's bytes)
        self._read = [None] * len(parts) if bool(self.rows.fresh.any()) else parts
        conv, rec, kvb, g = parts
        return conv, rec, OpenChunk(kvb, g, self.rows.open_lengths.to(cache.device))

    def write(self, conv: torch.Tensor, recurrent: torch.Tensor, open_chunk: OpenChunk) -> None:
        cache, n = self.cache, len(self.rows.slots)
        values = (conv, recurrent, open_chunk.kvb, open_chunk.g)
        for (offset, _), (_, dtype), value, read in zip(self.regions, cache.parts, values, self._read):
            if value is read:  # handed back as read (a boundary state no chunk completed): the blocks hold it
                continue
            cache._write(self.rows.slots, offset, value.to(cache.device, dtype).contiguous().view(n, -1).view(torch.uint8))


@contextmanager
def probing(cache):
    """Timing and sizing probes feed rows at positions their states never saw (their rows share
    scratch blocks; only the shapes matter): the state check is off meanwhile. No-op for a cache
    without states."""
    if not hasattr(cache, "checks_state"):
        yield cache
        return
    cache.checks_state = False
    try:
        yield cache
    finally:
        cache.checks_state = True
