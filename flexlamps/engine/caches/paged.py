"""A PagedAttention-style KV cache: fixed-size blocks in a `gpu` pool plus a `cpu` swap pool.

The scheduler's BlockManager decides which block ids a request owns (it deals in ids only);
this module owns the tensors behind those ids and performs the copies it is told to do.
Per layer the gpu pool is (num_gpu_blocks, kv_heads, block_size, head_dim) for K and for V,
so its bytes are exactly num_gpu_blocks x block_size x the model's KV bytes per token, which
is what the BlockManager counts.

Before each forward the engine sets the step's block tables (`set_block_tables`); the
`attend_fn(layer, slots, positions)` contract is the dense cache's, with `slots` indexing
rows of that per-step table: each row writes its new K/V at its own positions, then attends
over its blocks with the mask key_pos <= query_pos. A step whose rows are padded after their
real tokens (`Step.lengths`: a one-token prompt chunk fed as a two-column prompt) writes only the
real tokens: a pad's position may lie in a block the request does not own (`step_geometry`).

When every layer slides (Mistral-v0.1), a request keeps only `ring_blocks` blocks, a ring of
whole blocks holding its last window (the scheduler's BlockManager gives it no more: its
`max_blocks`): position p lives at offset p % (ring_blocks x block_size) of the ring, read before
the step writes it and gathered as caches.window does, so results stay those of all its blocks.
A model with full-attention layers keeps every block (those layers read them all).

Must not import the scheduler (it only sees block ids from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from flexlamps.engine.caches.fresh import fresh_keys, is_fresh_prefill
from flexlamps.engine.caches.window import paged_ring_blocks, ring_index, ring_keys, ring_step
from flexlamps.models.blocks.attention import AttnOptions, attention, visible_keys
from flexlamps.models.config import ModelConfig
from flexlamps.models.families.support import check_paged


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def refuse_recurrent_state(cfg: ModelConfig) -> None:
    """A hybrid model's DeltaNet state is no block of tokens: this cache would drop it; its paged
    cache is caches.paged_state.HybridPagedCache (what `executor.new_paged_cache` builds)."""
    if cfg.hybrid is not None:
        raise ValueError(f"{cfg.model_type} keeps a recurrent DeltaNet state per request beside its KV cache, "
                         "which PagedKVCache does not hold; build its paged cache with executor.new_paged_cache "
                         "(HybridPagedCache)")


@dataclass(frozen=True)
class PagedGeometry:
    """What every layer of one step shares (`PagedKVCache.step_geometry`)."""
    span: int  # cache positions the step reads: its last real token's + 1
    real: tuple[torch.Tensor, torch.Tensor] | None  # (rows, columns) of the real tokens; None: every token
    lengths: torch.Tensor | None  # (n,) real tokens a row, the rest padding; None: every token


class PagedKVCache:
    """K/V blocks on the gpu tier (where attention runs) and a cpu swap pool.

    Args:
        cfg: model shapes (layers, kv heads, head dim).
        num_gpu_blocks / num_cpu_blocks: pool sizes in blocks (the BlockManager's counts).
        block_size: tokens per block.
        dtype: cache dtype (the compute dtype).
        device: the gpu tier's device (the CPU when there is no GPU; budgets still apply).
        budgets: optional {"gpu": TierBudget, "cpu": TierBudget} charged for the two pools.
    """

    packs_rows = False  # a row is a request's block table
    rewinds = True  # a row may be fed again from an earlier position (but not a ring: see __init__)

    def __init__(self, cfg: ModelConfig, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", budgets: dict | None = None):
        check_paged(cfg.model_type)  # an MLA latent cache is no K/V heads
        refuse_recurrent_state(cfg)
        if num_gpu_blocks <= 0 or num_cpu_blocks < 0 or block_size <= 0:
            raise ValueError(f"paged cache needs num_gpu_blocks > 0, num_cpu_blocks >= 0, block_size > 0; "
                             f"got {num_gpu_blocks}, {num_cpu_blocks}, {block_size}")
        self.cfg, self.block_size, self.dtype = cfg, block_size, dtype
        self.device = torch.device(device)
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        self.block_bytes = block_size * cfg.kv_bytes_per_token(_dtype_bytes(dtype))
        self.ring_blocks = paged_ring_blocks(cfg, block_size)  # blocks a request keeps at most; None: all
        if self.ring_blocks is not None:
            self.rewinds = False  # a ring holds the last window only: a row cannot be fed again from far back
        self._budgets, self._charged = budgets or {}, []
        for tier, n in (("gpu", num_gpu_blocks), ("cpu", num_cpu_blocks)):
            if tier in self._budgets:
                self._budgets[tier].allocate(n * self.block_bytes, f"paged KV {tier} pool ({n} blocks)")
                self._charged.append((tier, n * self.block_bytes))
        self.k, self.v, self.k_cpu, self.v_cpu = self._new_pools()
        self._tables = torch.zeros((0, 1), dtype=torch.long, device=self.device)

    def _new_pools(self) -> tuple[list, list, list, list]:
        """Per layer: K and V blocks of the gpu pool, then of the cpu pool."""
        cfg, dtype = self.cfg, self.dtype
        block = (cfg.num_kv_heads, self.block_size, cfg.head_dim)
        # NOTE: zero-filled so that masked-out keys of a partly filled block are finite (SDPA
        # turns a masked NaN score into NaN output).
        k = [torch.zeros((self.num_gpu_blocks, *block), dtype=dtype, device=self.device) for _ in range(cfg.num_layers)]
        k_cpu = [torch.zeros((self.num_cpu_blocks, *block), dtype=dtype) for _ in range(cfg.num_layers)]
        return k, [torch.zeros_like(t) for t in k], k_cpu, [torch.zeros_like(t) for t in k_cpu]

    # -- sizes -------------------------------------------------------------------------------
    @classmethod
    def blocks_in(cls, cfg: ModelConfig, nbytes: int, block_size: int, dtype: torch.dtype) -> int:
        """How many blocks fit in `nbytes` (to size the BlockManager from a byte budget)."""
        return int(nbytes) // (block_size * cfg.kv_bytes_per_token(_dtype_bytes(dtype)))

    @property
    def gpu_pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def cpu_pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_cpu + self.v_cpu)

    def release(self) -> None:
        """Return the pools' bytes to their budgets (the tensors go with the cache)."""
        for tier, n in self._charged:
            self._budgets[tier].free(n)
        self._charged = []

    # -- moves decided by the BlockManager ------------------------------------------------------
    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (gpu block, cpu block) pairs to the cpu pool."""
        if not pairs:
            return
        gpu = torch.tensor([g for g, _ in pairs], device=self.device)
        cpu = torch.tensor([c for _, c in pairs])
        for layer in range(self.cfg.num_layers):
            self.k_cpu[layer][cpu] = self.k[layer][gpu].to("cpu")
            self.v_cpu[layer][cpu] = self.v[layer][gpu].to("cpu")

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy (cpu block, gpu block) pairs back to the gpu pool."""
        if not pairs:
            return
        cpu = torch.tensor([c for c, _ in pairs])
        gpu = torch.tensor([g for _, g in pairs], device=self.device)
        for layer in range(self.cfg.num_layers):
            self.k[layer][gpu] = self.k_cpu[layer][cpu].to(self.device)
            self.v[layer][gpu] = self.v_cpu[layer][cpu].to(self.device)

    def free_blocks(self, gpu_blocks: Sequence[int] = ()) -> None:
        """Blocks given back to the pool need no data movement: every position a request reads
        is written by that request first (its prefill, decode or recompute), and stale entries
        past its length are masked. Zeroing them keeps masked keys finite."""
        if gpu_blocks:
            idx = torch.tensor(list(gpu_blocks), device=self.device)
            for layer in range(self.cfg.num_layers):
                self.k[layer][idx] = 0
                self.v[layer][idx] = 0

    # -- attention -------------------------------------------------------------------------------
    def set_block_tables(self, tables: Sequence[Sequence[int]]) -> torch.Tensor:
        """Install this step's block tables (one row per micro-batch row); returns the `slots`
        tensor (row indices) to pass to the executor. Short tables are padded with block 0,
        whose entries the causal mask hides."""
        width = max(1, max((len(t) for t in tables), default=1))
        rows = torch.zeros((len(tables), width), dtype=torch.long)
        for r, t in enumerate(tables):
            if t:
                rows[r, :len(t)] = torch.tensor(list(t))
        self._tables = rows.to(self.device)
        return torch.arange(len(tables), device=self.device)

    def step_geometry(self, slots: torch.Tensor, positions: torch.Tensor, segments=None,
                      lengths: torch.Tensor | None = None) -> PagedGeometry:
        """The step's span and real tokens, once for all its layers; `lengths` (n,): each row's
        real tokens, the rest padding (None: all real)."""
        if segments is not None:
            raise ValueError("a paged cache row holds one request: packed rows (segments) are not taken")
        if lengths is None:
            return PagedGeometry(int(positions.max()) + 1, None, None)
        lengths = lengths.to(positions.device)
        real = torch.arange(positions.shape[1], device=positions.device)[None, :] < lengths[:, None]  # (n, T)
        return PagedGeometry(int(positions[real].max()) + 1, real.nonzero(as_tuple=True), lengths)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
                  geometry: PagedGeometry | None = None):
        """The `attend(q, k, v, opts)` callback for one layer of one step (see blocks.decoder.Attend)."""
        return lambda q, k, v, opts=None: self.attend(layer, slots, positions, q, k, v, opts, geometry)

    def attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, opts: AttnOptions | None = None, geometry: PagedGeometry | None = None) -> torch.Tensor:
        geometry = geometry or self.step_geometry(slots, positions)
        if self.ring_blocks is not None:
            return self._ring_attend(layer, slots, positions, q, k, v, opts, geometry.lengths)
        n, t, heads, d = q.shape
        bs = self.block_size
        tables = self._tables[slots]  # (n, width)
        kc, vc = self.k[layer], self.v[layer]
        self._write_tokens(layer, tables, positions, k, v, geometry.real)
        if is_fresh_prefill(positions):  # see caches.fresh
            span = t
            keys, values = fresh_keys(k, v)
        else:
            num_blocks = (geometry.span - 1) // bs + 1
            span = num_blocks * bs
            used = tables[:, :num_blocks]  # (n, B)
            # (n, B, kv_heads, bs, d) -> (n, kv_heads, B * bs, d)
            keys = kc[used].permute(0, 2, 1, 3, 4).reshape(n, -1, span, d)
            values = vc[used].permute(0, 2, 1, 3, 4).reshape(n, -1, span, d)
        # query at position p sees keys 0..p of its own request (its window's, if the layer has one)
        mask = visible_keys(span, positions.to(q.device), opts.window if opts is not None else None)
        out = attention(q.transpose(1, 2), keys, values, mask, opts)
        return out.transpose(1, 2).reshape(n, t, heads * d)

    def _write_tokens(self, layer: int, tables: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               real: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The step's keys and values k, v (n, T, kv_heads, d) at their positions, the real tokens
        only: position p of row r lives at block tables[r, p // bs], offset p % bs."""
        kc, vc, bs = self.k[layer], self.v[layer], self.block_size
        if real is None:
            blocks, offsets = tables.gather(1, positions // bs), positions % bs  # (n, T)
        else:
            rows, cols = real
            at = positions[rows, cols]
            blocks, offsets, k, v = tables[rows, at // bs], at % bs, k[rows, cols], v[rows, cols]
        kc[blocks, :, offsets] = k.to(kc.dtype)
        vc[blocks, :, offsets] = v.to(vc.dtype)

    def _ring_attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, q: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor, opts: AttnOptions | None,
                     lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer slides: each row's blocks are a ring of `ring_blocks` blocks (caches.window)."""
        if opts is None or opts.window is None:
            raise ValueError(f"paged KV layer {layer} keeps a ring of blocks for a sliding window, but the layer "
                             "attends without one")
        n, t, heads, d = q.shape
        bs, ring = self.block_size, self.ring_blocks * self.block_size
        tables = self._tables[slots][:, :self.ring_blocks]
        tables = F.pad(tables, (0, self.ring_blocks - tables.shape[1]))  # short tables: block 0, masked
        step = ring_step(positions, opts.window, lengths, ring=ring)  # pads are never written
        kc, vc = self.k[layer], self.v[layer]
        if is_fresh_prefill(positions):  # see caches.fresh
            keys, values = fresh_keys(k, v)
        else:  # ring offset o of a row: block tables[row, o // bs], offset o % bs
            index = ring_index(tables.gather(1, step.ring_at // bs), step.ring_at % bs, bs, kc.shape[1])
            keys, values = ring_keys(kc.view(-1, d), index, k, step), ring_keys(vc.view(-1, d), index, v, step)
        blocks = tables[step.write_rows, step.write_slots // bs]
        offsets = step.write_slots % bs
        kc[blocks, :, offsets] = k[step.write_rows, step.write_tokens].to(kc.dtype)
        vc[blocks, :, offsets] = v[step.write_rows, step.write_tokens].to(vc.dtype)
        out = attention(q.transpose(1, 2), keys, values, step.mask, opts)
        return out.transpose(1, 2).reshape(n, t, heads * d)
