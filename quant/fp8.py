"""FP8 storage: `float8_e4m3fn` codes with one fp32 scale per block, upcast for compute.

Two uses:
- weights of FP8 checkpoints (`quantization_config.quant_method: fp8`, DeepSeek-V3): a
  (out, in) matrix in FP8 and `weight_scale_inv` with one scale per 128x128 tile, so that
  weight = codes * scale (`dequantize_weight`);
- the MLA latent cache in ESS's layout (`LatentRecords`): each token's entry is one flat
  record of bytes — the latent in FP8 with a scale per 128 values, then the rotary key in
  bf16 — so storing, gathering and copying an entry moves one contiguous row.
Sizes come from `quant.fp8_layout` (torch-free, used by the planner).
"""

from __future__ import annotations

import torch

from quant.fp8_layout import CACHE_BLOCK, WEIGHT_BLOCK, fp8_vector_bytes

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn

def quantize_blocks(x: torch.Tensor, block: int = CACHE_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., d) -> codes (..., d) FP8 and scales (..., ceil(d / block)) fp32, per block of the last dim."""
    d = x.shape[-1]
    pad = -d % block
    xf = torch.nn.functional.pad(x.float(), (0, pad)).unflatten(-1, (-1, block))  # (..., nb, block)
    scales = xf.abs().amax(-1) / FP8_MAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block keeps scale 1
    codes = (xf / scales.unsqueeze(-1)).to(FP8).flatten(-2)[..., :d]
    return codes, scales

def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                      block: int = CACHE_BLOCK) -> torch.Tensor:
    """Inverse of quantize_blocks (up to FP8 rounding), in `dtype`."""
    per_value = scales.repeat_interleave(block, dim=-1)[..., :codes.shape[-1]]
    return (codes.float() * per_value).to(dtype)

def quantize_weight(w: torch.Tensor, block: tuple[int, int] = WEIGHT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) -> FP8 codes (out, in) and scales (ceil(out/b0), ceil(in/b1)) as checkpoints store them."""
    rows, cols = w.shape
    pr, pc = -rows % block[0], -cols % block[1]
    tiles = torch.nn.functional.pad(w.float(), (0, pc, 0, pr))
    tiles = tiles.view((rows + pr) // block[0], block[0], (cols + pc) // block[1], block[1])
    scales = tiles.abs().amax(dim=(1, 3)) / FP8_MAX
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = (tiles / scales[:, None, :, None]).to(FP8).view(rows + pr, cols + pc)[:rows, :cols]
    return codes.contiguous(), scales

def dequantize_weight(codes: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                      block: tuple[int, int] = WEIGHT_BLOCK) -> torch.Tensor:
    """An FP8 checkpoint matrix times its per-tile `weight_scale_inv`, in `dtype`."""
    rows, cols = codes.shape
    expected = (-(-rows // block[0]), -(-cols // block[1]))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"FP8 weight of shape {(rows, cols)} with block {block} needs scales of shape "
                         f"{expected}, got {tuple(scale_inv.shape)}")
    scale = scale_inv.float().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (codes.float() * scale).to(dtype)

class LatentRecords:
    """One token's cached entry as a flat uint8 record: `width` values in FP8 with a scale per
    `block`, then `tail` values in bf16 (the rotary key; 0 for indexer keys).

    DeepSeek-V3.2's latent: width 512, tail 64 -> 512 + 4 * 4 + 64 * 2 = 656 B; its indexer
    key: width 128, tail 0 -> 132 B.
    """

    def __init__(self, width: int, tail: int = 0, block: int = CACHE_BLOCK):
        self.width, self.tail, self.block = width, tail, block
        self.num_scales = -(-width // block)
        self.scale_offset = width
        self.tail_offset = fp8_vector_bytes(width, block)
        self.record_bytes = self.tail_offset + 2 * tail
        self.storage_dtype, self.record_len = torch.uint8, self.record_bytes  # a record's tensor form

    def pack(self, values: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        """values (..., width) [and tail (..., tail)] -> records (..., record_bytes) uint8."""
        codes, scales = quantize_blocks(values, self.block)
        out = torch.empty((*values.shape[:-1], self.record_bytes), dtype=torch.uint8, device=values.device)
        out[..., :self.width] = codes.view(torch.uint8)
        out[..., self.scale_offset:self.tail_offset] = scales.contiguous().view(torch.uint8)
        if self.tail:
            out[..., self.tail_offset:] = tail.to(torch.bfloat16).contiguous().view(torch.uint8)
        return out

    def unpack(self, records: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """records (..., record_bytes) -> values (..., width) [, tail (..., tail)] in `dtype`."""
        codes = records[..., :self.width].contiguous().view(FP8)
        scales = records[..., self.scale_offset:self.tail_offset].contiguous().view(torch.float32)
        values = dequantize_blocks(codes, scales, dtype, self.block)
        if not self.tail:
            return values, None
        return values, records[..., self.tail_offset:].contiguous().view(torch.bfloat16).to(dtype)
