"""KV cache for the offload engine: each layer's cache lives on the tier the policy gives it,
optionally 4-bit compressed (grouped along the head dim), with its bytes charged to that tier.

Attention over a cache layer off the gpu tier either copies the rows it needs to the compute
device (charged to the gpu budget while used) or, with `cpu_attention`, runs where the cache
is, so only the queries and outputs move (FlexGen's choice for long caches).
"""

from __future__ import annotations

import torch

from flexlamps.engine.caches.channel_keys import ChannelGroupedKeys
from flexlamps.engine.caches.dense import _rows
from flexlamps.models.attention import attention
from flexlamps.models.config import ModelConfig
from placement.specs import CACHE_KEY_GROUP_TOKENS
from offload import tensor_bytes
from offload.budget import TierBudget


# Keys are grouped per channel over this many tokens (values per token along the head dim);
# the planner prices the same layout (placement.CompressionSpec.cache_bytes_per_element).
KEY_GROUP = CACHE_KEY_GROUP_TOKENS


class _PackedKV:
    """One layer's K or V as 4-bit codes + per-group step and min, per (slot, head, position)."""

    def __init__(self, shape, dtype, device, cfg):
        slots, heads, cap, d = shape
        self.qcfg = cfg
        self.groups = -(-d // cfg.group_size)
        self.d = d
        self.codes = torch.zeros((slots, heads, cap, d // 2), dtype=torch.uint8, device=device)
        self.scales = torch.zeros((slots, heads, cap, self.groups), dtype=dtype, device=device)
        self.mins = torch.zeros((slots, heads, cap, self.groups), dtype=dtype, device=device)
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.codes, self.scales, self.mins)

    def write(self, slots, positions, new):  # new: (n, T, heads, d)
        from quant.groupwise import quantize_grouped

        n, t, h, d = new.shape
        if d % 2:
            raise ValueError("a compressed cache needs an even head_dim")
        codes, step, mins = quantize_grouped(new.reshape(n * t * h, d, 1), self.qcfg)
        # row-local split halves: byte j of a head vector holds codes j and j + d/2
        codes = codes.reshape(n, t, h, d)
        packed = codes[..., : d // 2] | (codes[..., d // 2:] << 4)
        self.codes[slots[:, None], :, positions] = packed
        self.scales[slots[:, None], :, positions] = step.reshape(n, t, h, self.groups).to(self.dtype)
        self.mins[slots[:, None], :, positions] = mins.reshape(n, t, h, self.groups).to(self.dtype)

    def read(self, slots, span) -> torch.Tensor:
        codes = _rows(self.codes, slots, span)
        n, h, s, _ = codes.shape
        vals = torch.cat([codes & 15, codes >> 4], dim=-1).reshape(n, h, s, self.groups, -1)
        scales = _rows(self.scales, slots, span)[..., None].float()
        mins = _rows(self.mins, slots, span)[..., None].float()
        return (vals.float() * scales + mins).reshape(n, h, s, self.d).to(self.dtype)


def _layer_buffers(cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                   device: torch.device, compress=None):
    """One layer's K and V buffers (4-bit packed when `compress` is a QuantConfig)."""
    shape = (num_slots, cfg.num_kv_heads, capacity, cfg.head_dim)
    if compress is not None:
        return (ChannelGroupedKeys(shape, dtype, device, bits=compress.bits, group=KEY_GROUP),
                _PackedKV(shape, dtype, device, compress))
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


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
                 cpu_attention: bool = False, compress=None):
        if "disk" in tiers:
            raise ValueError("a KV cache on disk is not supported; give the cache gpu or cpu memory")
        self.capacity, self.num_slots = capacity, num_slots
        self.tiers, self.budgets = tiers, budgets
        self.device, self.cpu_attention, self.compress = device, cpu_attention, compress

        self.k, self.v = [], []
        self._charged: list[tuple[str, int]] = []
        try:
            for layer, tier in enumerate(tiers):
                # charged before it is allocated: a cache that does not fit never takes memory
                n = layer_bytes(cfg, num_slots, capacity, dtype, compress)
                budgets[tier].allocate(n, f"KV cache layer {layer} ({tier})")
                self._charged.append((tier, n))
                dev = device if tier == "gpu" else torch.device("cpu")
                k, v = _layer_buffers(cfg, num_slots, capacity, dtype, dev, compress)
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
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes)."""
        for layer in range(len(self.k)):
            if self.compress is not None:
                self.k[layer].copy_prefix_from(src.k[layer], length, slots)
                dst, source = self.v[layer], src.v[layer]
                for d, s in ((dst.codes, source.codes), (dst.scales, source.scales), (dst.mins, source.mins)):
                    d[slots.to(d.device), :, :length] = s[0, :, :length].to(d.device)
                continue
            for d, s in ((self.k[layer], src.k[layer]), (self.v[layer], src.v[layer])):
                d[slots.to(d.device), :, :length] = s[0, :, :length].to(d.device)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor):
        return lambda q, k, v: self.attend(layer, slots, positions, q, k, v)

    def attend(self, layer, slots, positions, q, k, v) -> torch.Tensor:
        n, t, heads, d = q.shape
        kc, vc = self.k[layer], self.v[layer]
        home = torch.device("cpu") if self.tiers[layer] != "gpu" else self.device
        slots_h, pos_h = slots.to(home), positions.to(home)
        span = int(positions.max()) + 1
        if self.compress is not None:
            kc.write(slots_h, pos_h, k.to(home))
            vc.write(slots_h, pos_h, v.to(home))
            keys, values = kc.read(slots_h, span), vc.read(slots_h, span)
        else:
            kc[slots_h[:, None], :, pos_h] = k.to(home)
            vc[slots_h[:, None], :, pos_h] = v.to(home)
            keys, values = _rows(kc, slots_h, span), _rows(vc, slots_h, span)
        staged = 0
        where = home
        if self.tiers[layer] != "gpu" and not self.cpu_attention:  # see attends_with_staged_rows
            # bring this micro-batch's rows to the compute device for attention
            staged = tensor_bytes(keys, values)
            self.budgets["gpu"].allocate(staged, f"KV cache layer {layer} rows staged for attention")
            keys, values = keys.to(self.device, copy=True), values.to(self.device, copy=True)
            where = self.device
        elif self.tiers[layer] == "gpu" and self.compress is not None:
            staged = tensor_bytes(keys, values)  # decompressed on the gpu tier: held while attending
            self.budgets["gpu"].allocate(staged, f"KV cache layer {layer} rows decompressed")
        try:
            qd = q.to(where)
            mask = torch.arange(span, device=where)[None, None, :] <= positions.to(where)[:, :, None]
            out = attention(qd.transpose(1, 2), keys, values, mask)
        finally:
            if staged:
                self.budgets["gpu"].free(staged)
        return out.transpose(1, 2).reshape(n, t, heads * d).to(self.device)
