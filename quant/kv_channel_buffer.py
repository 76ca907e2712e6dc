"""ChannelQuantizedKVBuffer: a compressed key cache grouped per channel, along the sequence.

FlexGen groups the whole cache along the head dim. On SmolLM2 (WikiText-2, 2k tokens,
transformers reference, `scripts/bench_quant.py --ppl-tokens`) that costs +14.9%
perplexity at 4 bits / group 64, almost all from the keys (keys alone +16.3%, values
alone +1.0%): a few key channels carry outliers that widen every token's group. Grouping
keys per channel along the sequence (KIVI's observation) measured +1.95% with values still
grouped along the head dim.

Such a group spans `group_size` tokens, so a token cannot be compressed alone: the newest
`< group_size` tokens stay dense in a small residual buffer and are compressed as one block
when it fills. Same interface as `QuantizedKVBuffer`: `append`, `dequantize(upto)`,
`truncate`, `to`, `nbytes`. Imports torch only.
"""
from __future__ import annotations

import torch

from quant.config import QuantConfig
from quant.groupwise import _work_dtype, quantize_grouped
from quant.kv_base import CompressedKVBuffer

KEY_CACHE_PER_CHANNEL = QuantConfig(bits=4, group_size=64, group_dim=2, symmetric=False)


class ChannelQuantizedKVBuffer(CompressedKVBuffer):
    """Compressed `[batch, num_heads, capacity, head_dim]` cache grouped along the sequence.

    Args:
        batch, num_heads, capacity, head_dim: the full (uncompressed) cache shape.
        config: groups along dim 2 (`KEY_CACHE_PER_CHANNEL`); `group_size` tokens per block.
        dtype: dtype of incoming K and of the stored scales and the dense residual.
        device: where the buffers live.
    """

    _TENSORS = ("codes", "scales", "residual")

    def __init__(
        self,
        batch: int,
        num_heads: int,
        capacity: int,
        head_dim: int,
        config: QuantConfig = KEY_CACHE_PER_CHANNEL,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str = "cpu",
    ) -> None:
        if config.resolve_dim(4) != 2:
            raise ValueError(
                f"ChannelQuantizedKVBuffer groups along the sequence; got group_dim={config.group_dim}, use 2"
            )
        if config.bits == 4 and config.group_size % 2:
            raise ValueError(f"4-bit blocks pack token pairs; group_size={config.group_size} must be even")
        super().__init__(batch, num_heads, capacity, head_dim, config, dtype)
        block = config.group_size
        num_blocks = max(1, capacity // block)  # a partial last block stays in the residual
        rows = block // 2 if config.bits == 4 else block
        # Block b holds tokens [b*gs, (b+1)*gs); at 4 bits, byte row j holds token j (low nibble)
        # and token j + gs/2 (high nibble) of the block.
        self.codes = torch.zeros((batch, num_heads, num_blocks, rows, head_dim), dtype=torch.uint8, device=device)
        self.scales = torch.zeros((batch, num_heads, num_blocks, head_dim), dtype=dtype, device=device)
        self.mins = None if config.symmetric else torch.zeros_like(self.scales)
        self.residual = torch.zeros((batch, num_heads, block, head_dim), dtype=dtype, device=device)

    @property
    def num_full_blocks(self) -> int:
        return self.length // self.config.group_size

    def append(self, new: torch.Tensor) -> None:
        """Add `new` `[batch, heads, num_new, head_dim]` after the last token."""
        batch, heads, _, head_dim = self.shape
        if new.dim() != 4 or (new.shape[0], new.shape[1], new.shape[3]) != (batch, heads, head_dim):
            raise ValueError(f"new K/V has shape {tuple(new.shape)}, expected [{batch}, {heads}, num_new, {head_dim}]")
        if self.length + new.shape[2] > self.capacity:
            raise ValueError(
                f"tokens [{self.length}, {self.length + new.shape[2]}) do not fit a buffer of capacity "
                f"{self.capacity}; allocate more"
            )
        block = self.config.group_size
        new = new.to(device=self.device, dtype=self.dtype)
        taken = 0
        while taken < new.shape[2]:  # fill the residual; compress it each time it is full
            fill = self.length % block
            count = min(block - fill, new.shape[2] - taken)
            self.residual[:, :, fill : fill + count] = new[:, :, taken : taken + count]
            taken += count
            self.length += count
            if self.length % block == 0:
                self._compress_residual(self.length // block - 1)

    def _compress_residual(self, block_idx: int) -> None:
        batch, heads, _, head_dim = self.shape
        block = self.config.group_size
        rows = self.residual.reshape(batch * heads, block, head_dim)  # (B*H, gs, D): one group per channel
        codes, scales, mins = quantize_grouped(rows, self.config)  # scales (B*H, 1, 1, D)
        codes = codes.view(batch, heads, block, head_dim)
        if self.config.bits == 4:
            half = block // 2
            codes = codes[:, :, :half] | (codes[:, :, half:] << 4)
        self.codes[:, :, block_idx] = codes
        self.scales[:, :, block_idx] = scales.view(batch, heads, head_dim)
        if self.mins is not None:
            self.mins[:, :, block_idx] = mins.view(batch, heads, head_dim)

    def dequantize(self, upto: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Dense `[batch, heads, upto, head_dim]` of tokens `[0, upto)` (default: `length`)."""
        upto = self._written(upto)
        dtype = dtype or self.dtype
        batch, heads, _, head_dim = self.shape
        block = self.config.group_size
        full = self.num_full_blocks
        work_dtype = _work_dtype(dtype, self.device)
        work = torch.empty((batch, heads, full, block, head_dim), dtype=work_dtype, device=self.device)
        codes = self.codes[:, :, :full]
        if self.config.bits == 4:
            work[:, :, :, : block // 2].copy_(codes & 15)
            work[:, :, :, block // 2 :].copy_(codes >> 4)
        else:
            work.copy_(codes)
        scales = self.scales[:, :, :full, None, :].to(work_dtype)  # (B, H, blocks, 1, D)
        if self.mins is None:
            offsets = scales * -(1 << (self.config.bits - 1))
        else:
            offsets = self.mins[:, :, :full, None, :].to(work_dtype)
        torch.addcmul(offsets, work, scales, out=work)
        residual = self.residual[:, :, : self.length % block].to(work_dtype)
        dense = torch.cat([work.view(batch, heads, full * block, head_dim), residual], dim=2)[:, :, :upto]
        return dense if dense.dtype == dtype else dense.to(dtype)

    def truncate(self, length: int) -> None:
        """Forget tokens from `length` on; a cut into a compressed block makes it dense again."""
        self._check_truncate(length)
        block = self.config.group_size
        start = length // block * block
        if length % block and start + block <= self.length:  # the cut block was compressed
            self.residual.copy_(self.dequantize(start + block)[:, :, start:].to(self.dtype))
        self.length = length
