"""A dense, preallocated KV cache: one row ("slot") per running sequence, per layer.

Layout per layer: (slots, kv_heads, capacity, head_dim). Sequences write their new keys at
their own positions, so a batch mixes sequences of any length without padding the cache;
attention masks each row at its own length.

On the CPU an fp16 cache is held in fp32: the attention there computes in fp32 (see
models.attention), so it would otherwise convert every layer's keys and values at every decode
step. The values held are the keys and values as computed, exactly (the wider type holds them
all), so results do not change; the cache takes twice the bytes of the compute dtype. A bf16
cache is held in bf16: bf16 attention reads bf16 keys (models.blocks.attention upcasts per block),
and a decode step reads every cached key, so half the bytes is what it spends its time on.

A sliding-window layer whose window is shorter than the capacity keeps a ring of its last
`window` positions per row instead (caches.window), with the same results.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from flexlamps.engine.caches.fresh import fresh_keys, is_fresh_prefill
from flexlamps.engine.caches.segments import segment_attention, with_fresh
from flexlamps.engine.caches.window import (RingRows, RingStep, copy_ring_prefix, layer_rings, may_ring, refuse_packed,
                                            ring_index, ring_keys, ring_step, write_ring)
from flexlamps.engine.executors.step import Segments
from flexlamps.models.blocks.attention import AttnOptions, attention, visible_keys
from flexlamps.models.config import ModelConfig


class DenseKVCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        dtype = held_dtype(dtype, device)
        self.rings = layer_rings(cfg, capacity)  # a window layer's ring, or None: the whole row
        shapes = [(num_slots, cfg.num_kv_heads, ring or capacity, cfg.head_dim) for ring in self.rings]
        self.k = [zeroed(shape, dtype, device) for shape in shapes]
        self.v = [zeroed(shape, dtype, device) for shape in shapes]
        self.capacity = capacity
        self.num_slots = num_slots
        self.ring_rows = RingRows(num_slots, self.rings)
        # packed sequences and rows fed again from far back need whole rows (see scoring)
        self.packs_rows = self.rewinds = not may_ring(cfg)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def release(self) -> None:
        """Nothing to hand back: a dense cache is charged to no tier budget (see TieredKVCache)."""

    def copy_prefix_from(self, src: "DenseKVCache", length: int, slots: torch.Tensor) -> None:
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes;
        a ring layer takes the last `window` of them)."""
        for layer in range(len(self.k)):
            ring, src_ring = self.rings[layer], src.rings[layer]
            if ring is None and src_ring is None:
                self.k[layer][slots, :, :length] = src.k[layer][0, :, :length]
                self.v[layer][slots, :, :length] = src.v[layer][0, :, :length]
                continue
            src.ring_rows.check_source(length, length if ring is None else min(length, ring))
            copy_ring_prefix(self.k[layer], ring, src.k[layer], src_ring, length, slots)
            copy_ring_prefix(self.v[layer], ring, src.v[layer], src_ring, length, slots)
        self.ring_rows.copied(slots, length)

    def step_geometry(self, slots: torch.Tensor, positions: torch.Tensor,
                      segments: Segments | None = None, lengths: torch.Tensor | None = None) -> "StepGeometry":
        """What every layer of one step shares (span, mask, where the rows are), computed once.
        `positions`: where the step's keys are written; `segments`: a packed step's attention;
        `lengths` (a padded step's real tokens): the tokens a ring layer writes (no query reads the
        padding). Once per step when some layer rings: it records how far each row is written."""
        first = _first_of_block(slots)
        rings = {}
        if self.ring_rows.active:  # checked and recorded once per step (caches.window)
            refuse_packed(segments)
            self.ring_rows.begin_step(slots, positions, lengths)
            rings = {w: ring_step(positions, w, lengths) for w in set(self.rings) if w is not None}
        if segments is not None:
            return StepGeometry(slots, positions, segments.span, None, first, segments=segments)
        span = int(positions.max()) + 1
        # query at position p sees keys 0..p of its own row: causal and per-row length in one mask
        mask = visible_keys(span, positions)
        return StepGeometry(slots, positions, span, mask, first, is_fresh_prefill(positions),
                            decode_at=_shared_decode_position(positions, span, first), rings=rings)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
                  geometry: "StepGeometry | None" = None):
        """The `attend(q, k, v, opts)` callback for one layer of one step (see blocks.decoder.Attend);
        `geometry` (from `step_geometry` on these slots and positions) saves recomputing it."""
        geo = geometry or self.step_geometry(slots, positions)
        return lambda q, k, v, opts=None: self.attend(layer, slots, positions, q, k, v, geo, opts)

    def attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, geometry: "StepGeometry | None" = None,
               opts: AttnOptions | None = None) -> torch.Tensor:
        geo = geometry or self.step_geometry(slots, positions)
        n, t, heads, d = q.shape
        kc, vc = self.k[layer], self.v[layer]
        if self.rings[layer] is not None:
            return _ring_attend(kc, vc, geo, _ring_of(geo, self.rings[layer], opts), q, k, v, opts)
        _write(kc, geo, k)
        _write(vc, geo, v)
        if geo.segments is not None:  # the rows before the step's own tokens, then those as computed
            before = geo.segments.fresh_from
            keys = with_fresh(_rows(kc, geo.slots, before, geo.first) if before else None, k)
            values = with_fresh(_rows(vc, geo.slots, before, geo.first) if before else None, v)
            return segment_attention(q, keys, values, geo.segments, opts).reshape(n, t, heads * d)
        if geo.fresh:  # see caches.fresh
            keys, values = fresh_keys(k, v)
        else:
            keys, values = _rows(kc, geo.slots, geo.span, geo.first), _rows(vc, geo.slots, geo.span, geo.first)
        out = attention(q.transpose(1, 2), keys, values, geo.mask_for(opts), opts)
        return out.transpose(1, 2).reshape(n, t, heads * d)


def _ring_of(geo: "StepGeometry", ring: int, opts: AttnOptions | None) -> RingStep:
    """The step's reads and writes of a ring layer, whose attention must slide by its ring."""
    if opts is None or opts.window != ring:
        raise ValueError(f"a cache layer keeps a ring of {ring} positions for its sliding window, but the layer "
                         f"attends with window {None if opts is None else opts.window}")
    return geo.rings[ring]


def _ring_attend(kc, vc, geo: "StepGeometry", step: RingStep, q, k, v, opts: AttnOptions) -> torch.Tensor:
    """A ring layer (caches.window): the ring's keys read before the step writes its own."""
    n, t, heads, d = q.shape
    if geo.fresh:  # see caches.fresh
        keys, values = fresh_keys(k, v)
    else:
        index = ring_index(geo.slots, step.ring_at, kc.shape[2], kc.shape[1])
        keys = ring_keys(kc.view(-1, kc.shape[-1]), index, k, step)
        values = ring_keys(vc.view(-1, vc.shape[-1]), index, v, step)
    write_ring(kc, geo.slots, k, step)
    write_ring(vc, geo.slots, v, step)
    out = attention(q.transpose(1, 2), keys, values, step.mask, opts)
    return out.transpose(1, 2).reshape(n, t, heads * d)


def _write(cache: torch.Tensor, geo: "StepGeometry", new: torch.Tensor) -> None:
    """Write a step's keys or values `new` (n, T, kv_heads, d) at its rows' positions: a prompt chunk
    from position 0 into a block of rows is one strided copy (an indexed write takes 3-9x as long)."""
    if geo.fresh and geo.first is not None:
        cache[geo.first:geo.first + new.shape[0], :, :new.shape[1]].copy_(new.transpose(1, 2))
    elif geo.decode_at is not None:  # one position of a block of rows: a strided copy too
        cache[geo.first:geo.first + new.shape[0], :, geo.decode_at].copy_(new[:, 0])
    else:
        cache[geo.slots[:, None], :, geo.positions] = new.to(cache.dtype)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`torch.zeros(shape)`; on the CPU zeroed by one memset on this thread. torch's fill starts its
    OpenMP team for a tensor past its grain (a 1.1B batch-1 generate's cache: 44 such regions), and
    the team's idle thread then spins for milliseconds beside the kernels' claim-pool workers as the
    prefill starts: three threads on two cores (under load, a region waits for a descheduled one)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    t = torch.empty(shape, dtype=dtype)
    ctypes.memset(t.data_ptr(), 0, t.numel() * t.element_size())
    return t


def held_dtype(dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype a dense cache holds for keys and values computed in `dtype` on `device`."""
    return torch.float32 if torch.device(device).type == "cpu" and dtype == torch.float16 else dtype


@dataclass(frozen=True)
class StepGeometry:
    """One step's rows: `slots` (n,), `positions` (n, T), keys 0..span-1 read, `mask` (n, T, span),
    `first`: the first slot when the slots are one contiguous block (rows read as a view), else None;
    `fresh`: every row is a prompt chunk from position 0 (it attends over its own new keys);
    `segments`: a packed step's attention (then no mask); `decode_at`: the position every row
    writes its one token at, when they share it and the rows are a block (a batch-1 decode)."""
    slots: torch.Tensor
    positions: torch.Tensor
    span: int
    mask: torch.Tensor | None
    first: int | None
    fresh: bool = False
    segments: Segments | None = None
    decode_at: int | None = None
    rings: dict = field(default_factory=dict, compare=False, repr=False)  # ring -> its RingStep (caches.window)
    _windowed: dict = field(default_factory=dict, compare=False, repr=False)  # window -> mask, made once

    def mask_for(self, opts: AttnOptions | None) -> torch.Tensor:
        """`mask`, cut to the layer's sliding window if it has one."""
        window = opts.window if opts is not None else None
        if window is None:
            return self.mask
        if window not in self._windowed:
            self._windowed[window] = visible_keys(self.span, self.positions, window)
        return self._windowed[window]


def _shared_decode_position(positions: torch.Tensor, span: int, first: int | None) -> int | None:
    """`StepGeometry.decode_at`: span - 1 when each row writes one token there (rows a block)."""
    if positions.shape[1] != 1 or first is None:
        return None
    return span - 1 if positions.shape[0] == 1 or int(positions.min()) == span - 1 else None


def _first_of_block(slots: torch.Tensor) -> int | None:
    first = int(slots[0])
    contiguous = bool((slots == torch.arange(first, first + slots.shape[0], device=slots.device)).all())
    return first if contiguous else None


def _rows(cache: torch.Tensor, slots: torch.Tensor, span: int, first: int | None = -1) -> torch.Tensor:
    """Rows `slots` of the cache up to `span`; `first` as in `StepGeometry` (-1: find it here)."""
    first = _first_of_block(slots) if first == -1 else first
    if first is not None:
        return cache[first:first + slots.shape[0], :, :span]  # a contiguous block of rows: a view, no copy
    return cache[slots, :, :span]
