"""FP8 storage: `float8_e4m3fn` codes with one fp32 scale per block, upcast for compute.

Two uses:
- weights of FP8 checkpoints (`quantization_config.quant_method: fp8`, DeepSeek-V3): a
  (out, in) matrix in FP8 and `weight_scale_inv` with one scale per 128x128 tile, so that
  weight = codes * scale (`dequantize_weight`). The engine keeps them so (`Fp8Weight`) on
  every tier and upcasts one matrix at a time just before its GEMM (`models.linear`), with the
  same arithmetic as a dequantization at load, so results are the same bits;
- the MLA latent cache in ESS's layout (`LatentRecords`): each token's entry is one flat
  record of bytes — the latent in FP8 with a scale per 128 values, then the rotary key in
  bf16 — so storing, gathering and copying an entry moves one contiguous row.
Sizes come from `quant.fp8_layout` (torch-free, used by the planner).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from quant.compressed_weight import CompressedWeight

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

def check_tile_scales(shape, scale_shape, block: tuple[int, int]) -> tuple[int, int]:
    """The (rows, cols) tile grid of a `shape` weight; raises ValueError when `scale_shape` is another."""
    expected = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    if tuple(scale_shape) != expected:
        raise ValueError(f"FP8 weight of shape {tuple(shape)} with block {block} needs scales of shape "
                         f"{expected}, got {tuple(scale_shape)}")
    return expected


def fp8_values(codes: torch.Tensor) -> torch.Tensor:
    """The fp32 values of finite float8_e4m3fn `codes`, exactly (torch's own conversion gives
    the same; on a CPU it is a scalar loop, several times slower than these vector passes).

    An e4m3 code's bits moved into a bf16's (sign to sign, the 4 exponent and 3 mantissa bits
    to the low exponent and high mantissa bits) read as bf16 with bias 127 instead of 7: the
    value times 2^-120, exact for normal and subnormal codes alike; 2^120 restores it. The move:
    the code as int8 widened to int16 (sign-extended), times 16, the bits between sign and
    exponent cleared (mask 0x87f0). NaN codes (0x7f, 0xff) would read as 480: readers refuse
    them (`has_nan_codes`)."""
    return _fp8_values_into(codes, torch.empty(codes.shape, dtype=torch.int16, device=codes.device),
                            torch.empty(codes.shape, device=codes.device))


def _fp8_values_into(codes: torch.Tensor, bits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`fp8_values` through caller-given int16 and fp32 buffers of codes' shape (fresh ones
    page-fault: on a CPU that costs as much as the arithmetic)."""
    bits.copy_(codes.view(torch.int8)).mul_(16).bitwise_and_(-0x7810)  # 0x87f0 as int16
    return out.copy_(bits.view(torch.bfloat16)).mul_(2.0 ** 120)


def has_nan_codes(codes: torch.Tensor) -> bool:
    return bool(((codes.view(torch.uint8) & 0x7F) == 0x7F).any())


_DEQUANT_CHUNK_BYTES = 256 << 10  # fp32 values upcast at a time on a CPU: they stay in cache


def dequantize_weight(codes: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                      block: tuple[int, int] = WEIGHT_BLOCK, out: torch.Tensor | None = None) -> torch.Tensor:
    """An FP8 checkpoint matrix times its per-tile `weight_scale_inv`, in `dtype`: each value
    is code * scale in fp32, rounded once to `dtype` (finite codes); into `out` when given."""
    rows, cols = codes.shape
    check_tile_scales(codes.shape, scale_inv.shape, block)
    scale_inv = scale_inv.float()
    if out is None:
        out = torch.empty(rows, cols, dtype=dtype, device=codes.device)
    # NOTE(fp8): the codes' bits read as bf16 are their values times 2^-120 (`fp8_values`); the
    # 2^120 goes into the tile scales, one pass less, and the product is the same real number,
    # rounded once, unless a scale times 2^120 would overflow (then the two passes, as before)
    folded = bool(scale_inv.abs().max() < _FOLD_LIMIT)
    scale_inv = scale_inv * 2.0 ** 120 if folded else scale_inv
    # NOTE(fp8): a band of whole row tiles at a time on a CPU, so the temporaries stay in cache
    step = rows if codes.device.type != "cpu" else block[0] * max(1, _DEQUANT_CHUNK_BYTES // (4 * cols * block[0]))
    bits = torch.empty(min(step, rows), cols, dtype=torch.int16, device=codes.device)
    in_place = out.dtype == torch.float32 and out.is_contiguous()  # fp32: computed where it ends
    buf = None if in_place else torch.empty(min(step, rows), cols, device=codes.device)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        target = out[start:stop] if in_place else buf[:stop - start]
        values = _fp8_bits_into(codes[start:stop], bits[:stop - start], target, folded)  # (n, cols) fp32
        scale = scale_inv[start // block[0]:-(-stop // block[0])].repeat_interleave(block[0], 0)
        scale = scale[start % block[0]:][:stop - start]  # (n, col tiles): each row's tile scales
        if cols % block[1] == 0:  # whole column tiles: a broadcast
            values.view(stop - start, -1, block[1]).mul_(scale[:, :, None])
        else:
            values.mul_(scale.repeat_interleave(block[1], 1)[:, :cols])
        if not in_place:
            out[start:stop].copy_(values)
    return out


_FOLD_LIMIT = 2.0 ** 7  # scales below it times 2^120 stay finite in fp32 (largest 2^128)


def _fp8_bits_into(codes: torch.Tensor, bits: torch.Tensor, out: torch.Tensor, folded: bool) -> torch.Tensor:
    """The codes' fp32 values, times 2^-120 when `folded` (`fp8_values` without its last pass)."""
    if not folded:
        return _fp8_values_into(codes, bits, out)
    bits.copy_(codes.view(torch.int8)).mul_(16).bitwise_and_(-0x7810)
    return out.copy_(bits.view(torch.bfloat16))


# the compute dtypes an Fp8Weight may be upcast to, by their index in its stored `layout`
_UPCAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass(frozen=True, eq=False)
class Fp8Weight(CompressedWeight):
    """An FP8 checkpoint's (out, in) matrix kept as stored: codes and per-tile scales, upcast
    to `dtype` (the compute dtype) by `dequantize`, which `models.linear` calls per GEMM.
    Stored on a tier as plain tensors (`to_tensors`: codes as uint8, since FP8 has no numpy
    dtype for the disk tier) and rebuilt from them (`from_tensors`)."""

    KIND: ClassVar[str] = "fp8"
    PARTS: ClassVar[tuple[str, ...]] = ("codes", "scale_inv")
    codes: torch.Tensor  # (out, in) float8_e4m3fn
    scale_inv: torch.Tensor  # (ceil(out / block[0]), ceil(in / block[1])) fp32: weight = codes * scale
    block: tuple[int, int]  # the checkpoint's weight_block_size
    dtype: torch.dtype  # what it is upcast to: the compute dtype

    def __post_init__(self):
        if self.codes.dtype != FP8 or self.dtype not in _UPCAST_DTYPES:
            raise ValueError(f"Fp8Weight needs {FP8} codes and a compute dtype in {_UPCAST_DTYPES}, "
                             f"got {self.codes.dtype} and {self.dtype}")
        check_tile_scales(self.codes.shape, self.scale_inv.shape, self.block)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The dense (out, in) weight in `dtype` (default: the compute dtype), as at load; into
        `out` when given (a buffer reused across calls)."""
        return dequantize_weight(self.codes, self.scale_inv, dtype or self.dtype, self.block, out)

    def _stored(self, part: torch.Tensor) -> torch.Tensor:
        return part.view(torch.uint8) if part.dtype == FP8 else part

    def _layout(self) -> list[int]:
        return [*self.block, _UPCAST_DTYPES.index(self.dtype)]

    @classmethod
    def _from_parts(cls, parts: list[torch.Tensor], layout: list[int]) -> "Fp8Weight":
        codes, scale_inv = parts
        return cls(codes.view(FP8), scale_inv, (layout[0], layout[1]), _UPCAST_DTYPES[layout[2]])

    def __repr__(self) -> str:
        return f"Fp8Weight(shape={self.shape}, block={self.block}, dtype={self.dtype}, device={self.device})"


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

    def entries(self, records: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """records -> the values with the tail after them (..., width + tail) in `dtype`."""
        values, tail = self.unpack(records, dtype)
        return values if tail is None else torch.cat([values, tail], dim=-1)
