"""KV cache for the offload engine: each layer's cache lives on the tier the policy gives it,
optionally 4-bit compressed (quant.kv_rows: keys per channel, values along the head dim), with
its bytes charged to that tier (a disk-tier layer: files mapped into memory, `caches.disk_rows`,
read as a cpu-tier layer is, charged to no memory budget).

Attention over a cache layer off the gpu tier either copies the rows it needs to the compute
device (charged to the gpu budget while used) or, with `cpu_attention`, runs where the cache
is, so only the queries and outputs move (FlexGen's choice for long caches).

An uncompressed sliding-window layer whose window is shorter than the capacity keeps a ring of
its last `window` positions per row (caches.window): charged as such, the same results.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flexlamps.engine.caches.disk_rows import file_backed_zeros
from flexlamps.engine.caches.fresh import fresh_keys, is_fresh_prefill
from flexlamps.engine.caches.segments import segment_attention, with_fresh
from flexlamps.engine.caches.window import (RingRows, RingStep, copy_ring_prefix, layer_rings, may_ring, refuse_packed,
                                            ring_index, ring_keys, ring_step, write_ring)
from flexlamps.engine.executors.step import Segments
from flexlamps.models.blocks.attention import AttnOptions, attention, visible_keys
from flexlamps.models.config import ModelConfig
from offload import tensor_bytes
from offload.budget import TierBudget
from quant.kv_rows import ChannelGroupedRows, TokenGroupedRows, rows_of


def _layer_buffers(cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                   device: torch.device, compress=None, zeros=torch.zeros):
    """One layer's K and V buffers (4-bit packed when `compress` is a QuantConfig), allocated by
    `zeros` (a disk-tier layer's: `caches.disk_rows`)."""
    shape = (num_slots, cfg.num_kv_heads, capacity, cfg.head_dim)
    if compress is not None:
        return (ChannelGroupedRows(shape, dtype, device, zeros=zeros),  # quant.KV_KEYS_PER_CHANNEL, as planned
                TokenGroupedRows(shape, dtype, device, compress, zeros=zeros))
    return zeros(shape, dtype=dtype, device=device), zeros(shape, dtype=dtype, device=device)


def layer_bytes(cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype, compress=None) -> int:
    """Bytes one layer's cache charges its tier: its buffers built on the meta device (no memory)."""
    k, v = _layer_buffers(cfg, num_slots, capacity, dtype, torch.device("meta"), compress)
    return sum(x.nbytes if not isinstance(x, torch.Tensor) else tensor_bytes(x) for x in (k, v))


def staged_rows_bytes(cfg: ModelConfig, num_rows: int, span: int, dtype: torch.dtype) -> int:
    """Bytes `attend` holds on the gpu tier for the rows it attends to (K and V, uncompressed):
    copied in for a layer kept off it when attention does not run on the CPU, decompressed for a
    compressed layer on it (see `attends_with_staged_rows`)."""
    return 2 * num_rows * cfg.num_kv_heads * span * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


def attends_with_staged_rows(tier: str, cpu_attention: bool, compressed: bool) -> bool:
    """Whether attention over a layer on `tier` holds staged rows on the gpu tier."""
    return (tier != "gpu" and not cpu_attention) or (tier == "gpu" and compressed)


class TieredKVCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 tiers: list[str], budgets: dict[str, TierBudget], device: torch.device,
                 cpu_attention: bool = False, compress=None, disk_folder=None):
        """`tiers`: each layer's tier; a "disk" layer's buffers are files in `disk_folder`
        (`caches.disk_rows`: paged by the OS, charged to no memory budget), attended as a cpu one's."""
        if "disk" in tiers and disk_folder is None:
            raise ValueError("a KV cache layer on disk needs an offload folder (--offload-dir)")
        self.capacity, self.num_slots = capacity, num_slots
        self.tiers, self.budgets = tiers, budgets
        self.device, self.cpu_attention, self.compress = device, cpu_attention, compress

        self.k, self.v = [], []
        self._charged: list[tuple[str, int]] = []
        self.rings = layer_rings(cfg, capacity, compressed=compress is not None)  # caches.window
        self.ring_rows = RingRows(num_slots, self.rings)
        self.packs_rows = self.rewinds = compress is not None or not may_ring(cfg)  # as DenseKVCache's
        try:
            for layer, tier in enumerate(tiers):
                # charged before it is allocated: a cache that does not fit never takes memory
                held = self.rings[layer] or capacity
                zeros = torch.zeros if tier != "disk" else file_backed_zeros(disk_folder)
                if tier != "disk":
                    n = layer_bytes(cfg, num_slots, held, dtype, compress)
                    budgets[tier].allocate(n, f"KV cache layer {layer} ({tier})")
                    self._charged.append((tier, n))
                dev = device if tier == "gpu" else torch.device("cpu")
                k, v = _layer_buffers(cfg, num_slots, held, dtype, dev, compress, zeros)
                self.k.append(k)
                self.v.append(v)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for tier, n in self._charged:
            self.budgets[tier].free(n)
        self._charged = []
        self.k, self.v = [], []

    def copy_prefix_from(self, src: "TieredKVCache", length: int, slots: torch.Tensor) -> None:
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes;
        a ring layer takes the last `window` of them)."""
        self.ring_rows.copied(slots, length)
        for layer in range(len(self.k)):
            ring, src_ring = self.rings[layer], src.rings[layer]
            if ring is not None or src_ring is not None:
                src.ring_rows.check_source(length, length if ring is None else min(length, ring))
                copy_ring_prefix(self.k[layer], ring, src.k[layer], src_ring, length, slots)
                copy_ring_prefix(self.v[layer], ring, src.v[layer], src_ring, length, slots)
                continue
            if self.compress is not None:
                self.k[layer].copy_prefix_from(src.k[layer], length, slots)
                self.v[layer].copy_prefix_from(src.v[layer], length, slots)
                continue
            for d, s in ((self.k[layer], src.k[layer]), (self.v[layer], src.v[layer])):
                d[slots.to(d.device), :, :length] = s[0, :, :length].to(d.device)

    def step_geometry(self, slots: torch.Tensor, positions: torch.Tensor, segments: Segments | None = None,
                      lengths: torch.Tensor | None = None) -> "TieredStepGeometry":
        """What every layer of one step shares (see TieredStepGeometry), for `attend_fn(geometry=)`;
        `lengths` (a padded step's real tokens): the tokens a ring layer writes (no query reads the
        padding). Once per step: it records how far the rings' rows are written."""
        rings = {}
        if self.ring_rows.active:
            refuse_packed(segments)
            self.ring_rows.begin_step(slots, positions, lengths)
            rings = {w: ring_step(positions, w, lengths) for w in set(self.rings) if w is not None}
        return TieredStepGeometry(slots, positions, segments, rings)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, segments: Segments | None = None,
                  geometry: "TieredStepGeometry | None" = None):
        """`positions`: where the step's keys are written; `segments`: a packed step's attention;
        `geometry` (from `step_geometry` on these slots, positions and segments) saves recomputing it."""
        geo = geometry or self.step_geometry(slots, positions, segments)
        return lambda q, k, v, opts=None: self.attend(layer, slots, positions, q, k, v, geometry=geo, opts=opts)

    def attend(self, layer, slots, positions, q, k, v, segments: Segments | None = None,
               geometry: "TieredStepGeometry | None" = None, opts: AttnOptions | None = None) -> torch.Tensor:
        geo = geometry or self.step_geometry(slots, positions, segments)
        n, t, heads, d = q.shape
        home = torch.device("cpu") if self.tiers[layer] != "gpu" else self.device
        at_home = geo.on(home)
        if self.rings[layer] is not None:
            return self._ring_attend(layer, at_home.slots, home, q, k, v, geo, opts)
        self._write(layer, at_home.slots, at_home.positions, k.to(home), v.to(home))
        if geo.segments is not None:
            return self._packed_attend(layer, at_home.slots, home, q, k, v, geo, opts)
        if geo.fresh:  # see caches.fresh: nothing read back or staged
            (keys, values), where, staged = fresh_keys(k, v), k.device, 0
        else:
            keys, values, where, staged = self._rows_for_attention(layer, at_home.slots, geo.span, home)
        try:
            window = opts.window if opts is not None else None
            out = attention(q.to(where).transpose(1, 2), keys, values, geo.mask_on(where, window), opts)
        finally:
            if staged:
                self.budgets["gpu"].free(staged)
        return out.transpose(1, 2).reshape(n, t, heads * d).to(self.device)

    def _ring_attend(self, layer, slots, home, q, k, v, geo: "TieredStepGeometry",
                     opts: AttnOptions | None) -> torch.Tensor:
        """A ring layer (caches.window): the ring's rows and the step's keys gathered where the ring
        lives (staged on the compute device as any cpu-tier rows), read before the step writes."""
        n, t, heads, d = q.shape
        window = self.rings[layer]
        if opts is None or opts.window != window:
            raise ValueError(f"KV cache layer {layer} keeps a ring of {window} positions for its sliding window, "
                             f"but the layer attends with window {None if opts is None else opts.window}")
        step = geo.ring_on(home, window)
        kc, vc = self.k[layer], self.v[layer]
        where, staged = k.device, 0
        if geo.fresh:  # see caches.fresh
            keys, values = fresh_keys(k, v)
        else:
            index = ring_index(slots, step.ring_at, kc.shape[2], kc.shape[1])
            keys = ring_keys(kc.view(-1, kc.shape[-1]), index, k, step)
            values = ring_keys(vc.view(-1, vc.shape[-1]), index, v, step)
            where = home
            if self.tiers[layer] != "gpu" and not self.cpu_attention:  # as _rows_for_attention stages them
                staged = tensor_bytes(keys, values)
                self.budgets["gpu"].allocate(staged, f"KV cache layer {layer} rows staged for attention")
                keys, values, where = keys.to(self.device), values.to(self.device), self.device
        write_ring(kc, slots, k.to(home), step)
        write_ring(vc, slots, v.to(home), step)
        try:
            out = attention(q.to(where).transpose(1, 2), keys, values, geo.ring_on(where, window).mask, opts)
        finally:
            if staged:
                self.budgets["gpu"].free(staged)
        return out.transpose(1, 2).reshape(n, t, heads * d).to(self.device)

    def _packed_attend(self, layer, slots, home, q, k, v, geo: "TieredStepGeometry",
                       opts: AttnOptions | None) -> torch.Tensor:
        """A packed step (see executors.step.Segments): the rows before its own tokens as the
        layer's tier holds them (staged or decompressed), its own tokens' keys as computed."""
        n, t, heads, d = q.shape
        before = geo.segments.fresh_from
        cached_k = cached_v = None
        where, staged = k.device, 0
        if before:
            cached_k, cached_v, where, staged = self._rows_for_attention(layer, slots, before, home)
        try:
            keys, values = with_fresh(cached_k, k.to(where)), with_fresh(cached_v, v.to(where))
            out = segment_attention(q.to(where), keys, values, geo.on(where).segments, opts)
        finally:
            if staged:
                self.budgets["gpu"].free(staged)
        return out.reshape(n, t, heads * d).to(self.device)

    def _write(self, layer, slots, positions, k, v) -> None:
        """This step's keys and values into the layer's rows (all on the layer's tier)."""
        kc, vc = self.k[layer], self.v[layer]
        if self.compress is not None:
            kc.write(slots, positions, k)
            vc.write(slots, positions, v)
        else:
            kc[slots[:, None], :, positions] = k
            vc[slots[:, None], :, positions] = v

    def _rows_for_attention(self, layer, slots, span: int, home):
        """(keys, values, the device attention runs on, bytes held on the gpu tier meanwhile): the
        rows up to `span`, staged on the compute device or decompressed as the layer's tier needs."""
        kc, vc = self.k[layer], self.v[layer]
        if self.compress is not None:
            keys, values = kc.read(slots, span), vc.read(slots, span)
        else:
            keys, values = rows_of(kc, slots, span), rows_of(vc, slots, span)
        staged, where = 0, home
        if self.tiers[layer] != "gpu" and not self.cpu_attention:  # see attends_with_staged_rows
            # bring this micro-batch's rows to the compute device for attention; on a CPU-only
            # box that is the memory they are in (charged all the same: attention only reads them)
            staged = tensor_bytes(keys, values)
            self.budgets["gpu"].allocate(staged, f"KV cache layer {layer} rows staged for attention")
            keys, values = keys.to(self.device), values.to(self.device)
            where = self.device
        elif self.tiers[layer] == "gpu" and self.compress is not None:
            staged = tensor_bytes(keys, values)  # decompressed on the gpu tier: held while attending
            self.budgets["gpu"].allocate(staged, f"KV cache layer {layer} rows decompressed")
        return keys, values, where, staged


class PlacedStep(NamedTuple):
    """A step's rows on one device: `mask` (n, T, span) is None for a packed step (`segments`)."""
    slots: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    segments: Segments | None


class TieredStepGeometry:
    """One step's attention geometry, shared by all its layers: the span its keys reach, whether
    it is a fresh prefill (caches.fresh), and its slots, positions and causal mask (or a packed
    step's segments) moved to each device a layer needs them on, made at most once per device
    (the offload engine's layers sit on different tiers; per layer this was a mask, a span's
    device sync and four copies each)."""

    def __init__(self, slots: torch.Tensor, positions: torch.Tensor, segments: Segments | None = None,
                 rings: dict[int, RingStep] | None = None):
        self.segments = segments
        self._rings = {(torch.device(positions.device), w): step for w, step in (rings or {}).items()}
        self.fresh = segments is None and is_fresh_prefill(positions)
        self.span = segments.span if segments is not None else int(positions.max()) + 1
        self._slots, self._positions = slots, positions
        self._placed: dict[torch.device, PlacedStep] = {}
        self._windowed: dict[tuple[torch.device, int], torch.Tensor] = {}

    def on(self, device: torch.device) -> PlacedStep:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" are one placement
            device = torch.device("cuda", torch.cuda.current_device())
        placed = self._placed.get(device)
        if placed is None:
            positions = self._positions.to(device)
            mask = segments = None
            if self.segments is None:
                mask = visible_keys(self.span, positions)
            else:
                segments = self.segments.to(device)
            placed = self._placed[device] = PlacedStep(self._slots.to(device), positions, mask, segments)
        return placed

    def ring_on(self, device: torch.device, window: int) -> RingStep:
        """A ring layer's `RingStep` (caches.window) on `device` (moved at most once per device)."""
        device = self.on(device).positions.device
        if (device, window) not in self._rings:
            made = next(step for (_, w), step in self._rings.items() if w == window)
            self._rings[(device, window)] = made.to(device)
        return self._rings[(device, window)]

    def mask_on(self, device: torch.device, window: int | None) -> torch.Tensor:
        """`on(device).mask`, cut to a layer's sliding window if it has one (made once per window)."""
        placed = self.on(device)
        if window is None:
            return placed.mask
        key = (placed.positions.device, window)
        if key not in self._windowed:
            self._windowed[key] = visible_keys(self.span, placed.positions, window)
        return self._windowed[key]
