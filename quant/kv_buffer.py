"""QuantizedKVBuffer: a preallocated, compressed K (or V) cache that grows token by token.

The engine stores the cache one decode step at a time, so compressing must touch only
the new token. Groups run along the head dim (FlexGen's cache grouping), so each token's
groups live inside that token: `append` quantizes `[batch, heads, new, head_dim]` alone and
writes codes + scales into preallocated buffers; nothing older is re-read.

4-bit layout: codes are `[batch, heads, ceil(capacity/2), head_dim]` bytes; token t sits in
the low nibble of row t when t < capacity/2, else in the high nibble of row t - capacity/2.
Unpacking is then two contiguous ops per (batch, head), like `quant.pack`'s split halves,
instead of an interleave. Imports torch only.
"""
from __future__ import annotations


import torch

from quant.config import KV_CACHE_DEFAULT, QuantConfig
from quant.groupwise import apply_affine_, quantize_grouped, _work_dtype
from quant.kv_base import CompressedKVBuffer
from quant.qtensor import GroupLayout


class QuantizedKVBuffer(CompressedKVBuffer):
    """Compressed `[batch, num_heads, capacity, head_dim]` cache for one layer's K or V.

    Args:
        batch, num_heads, capacity, head_dim: the full (uncompressed) cache shape.
        config: a QuantConfig grouping along the last dim (`KV_CACHE_DEFAULT`).
        dtype: dtype of incoming K/V and of the stored scales; `dequantize` default.
        device: where the compressed buffers live.
    """

    _TENSORS = ("codes", "scales")

    def __init__(
        self,
        batch: int,
        num_heads: int,
        capacity: int,
        head_dim: int,
        config: QuantConfig = KV_CACHE_DEFAULT,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str = "cpu",
    ) -> None:
        if config.resolve_dim(4) != 3:
            raise ValueError(
                f"QuantizedKVBuffer groups along head_dim; got group_dim={config.group_dim}, use -1 or 3"
            )
        super().__init__(batch, num_heads, capacity, head_dim, config, dtype)
        self._half = (capacity + 1) // 2 if config.bits == 4 else capacity
        groups = GroupLayout(1, head_dim, 1, config.group_size).num_groups
        self.codes = torch.zeros((batch, num_heads, self._half, head_dim), dtype=torch.uint8, device=device)
        self.scales = torch.zeros((batch, num_heads, capacity, groups), dtype=dtype, device=device)
        self.mins = None if config.symmetric else torch.zeros_like(self.scales)

    def append(self, new: torch.Tensor) -> None:
        """Compress `new` `[batch, heads, num_new, head_dim]` and write it after the last token."""
        self.write(self.length, new)

    def write(self, start: int, new: torch.Tensor) -> None:
        """Compress `new` into token positions `[start, start + num_new)`; grows `length` to cover them."""
        batch, heads, _, head_dim = self.shape
        if new.dim() != 4 or (new.shape[0], new.shape[1], new.shape[3]) != (batch, heads, head_dim):
            raise ValueError(f"new K/V has shape {tuple(new.shape)}, expected [{batch}, {heads}, num_new, {head_dim}]")
        num_new = new.shape[2]
        end = start + num_new
        if start < 0 or end > self.capacity:
            raise ValueError(f"tokens [{start}, {end}) do not fit a buffer of capacity {self.capacity}; allocate more")
        rows = new.to(self.dtype).reshape(batch * heads * num_new, head_dim, 1)  # (B*H*T, D, 1)
        codes, scales, mins = quantize_grouped(rows, self.config)
        codes = codes.view(batch, heads, num_new, head_dim).to(self.device)
        self.scales[:, :, start:end] = scales.view(batch, heads, num_new, -1)
        if self.mins is not None:
            self.mins[:, :, start:end] = mins.view(batch, heads, num_new, -1)
        self._write_codes(start, codes)
        self.length = max(self.length, end)

    def _write_codes(self, start: int, codes: torch.Tensor) -> None:
        end = start + codes.shape[2]
        if self.config.bits == 8:
            self.codes[:, :, start:end] = codes
            return
        half = self._half
        low_end = min(end, half)
        if start < low_end:  # tokens in the low nibble plane
            rows = self.codes[:, :, start:low_end]
            rows.copy_((rows & 0xF0) | codes[:, :, : low_end - start])
        high_start = max(start, half)
        if high_start < end:  # tokens in the high nibble plane
            rows = self.codes[:, :, high_start - half : end - half]
            rows.copy_((rows & 0x0F) | (codes[:, :, high_start - start :] << 4))

    def dequantize(self, upto: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Dense `[batch, heads, upto, head_dim]` of tokens `[0, upto)` (default: `length`)."""
        upto = self._written(upto)
        dtype = dtype or self.dtype
        batch, heads, _, head_dim = self.shape
        work = torch.empty((batch, heads, upto, head_dim), dtype=_work_dtype(dtype, self.device), device=self.device)
        if self.config.bits == 8:
            work.copy_(self.codes[:, :, :upto])
        else:
            num_low = min(upto, self._half)
            work[:, :, :num_low].copy_(self.codes[:, :, :num_low] & 15)
            if upto > self._half:
                work[:, :, self._half :].copy_(self.codes[:, :, : upto - self._half] >> 4)
        groups = self.scales.shape[-1]
        scales = self.scales[:, :, :upto].to(work.dtype).reshape(-1, groups, 1, 1)  # (B*H*T, G, 1, 1)
        if self.mins is None:
            offsets = scales * -(1 << (self.config.bits - 1))
        else:
            offsets = self.mins[:, :, :upto].to(work.dtype).reshape(-1, groups, 1, 1)
        apply_affine_(work.view(-1, head_dim, 1), scales, offsets, self.config.group_size)
        return work if work.dtype == dtype else work.to(dtype)

    def truncate(self, length: int) -> None:
        """Forget tokens from `length` on (their slots are overwritten by later writes)."""
        self._check_truncate(length)
        self.length = length


__all__ = ["QuantizedKVBuffer"]
