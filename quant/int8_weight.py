"""Int8Weight: a weight of 8-bit codes with one scale per group of input channels, `w = d * q`
(GGUF's Q8_0: q in [-128, 127], an fp16 d per 32 inputs), multiplied in place by torch's fused
int4 kernel.

torch has no weight-only int8 kernel with group scales: `_weight_int8pack_mm` takes one scale per
output channel, so Q8_0 would have to be requantized (lossy), and looping it over the groups runs
5-80x slower than a dense GEMM. But an 8-bit code splits exactly into two 4-bit ones: with
q + 128 = 16 h + l (h, l in [0, 15]),

    d q = (h - 8) * 16 d  +  ((l - 8) * d + 8 d),

two groups in the int4 kernel's format `(code - 8) * scale + zero` (`quant.int4_weight`). The h
groups and the l groups side by side make one (N, 2K) 4-bit weight, and [x, x] times it is
x @ (d q).T in one fused call, accumulated in fp32 and rounded once. It holds 1.25 bytes per
weight (the kernel's codes and a scale and zero per 32) where a bf16 copy holds 2, and reads
that much per call: decode of one or two rows, which streams weights from memory, runs
1.3-2x faster than the dense GEMM; from about four rows the dense GEMM wins (`models.linear`
switches). The values are `round(d) * q` exactly, with d rounded once to the compute dtype; a
bf16 copy holds `round(d * q)` instead (the same relative error, at most 2^-8). A zero point per
group (GGUF's Q5_1 / Q5_K: `d q + m`) rides on the low halves' zeros: `8 d + m`. Imports torch only.
"""
from __future__ import annotations

import dataclasses

import torch

from quant.int4_tiles import tile_rows, tiles_from_unpacked
from quant.int4_weight import Int4Weight, unpack_codes

_DEQUANT_CHUNK_BYTES = 2 << 20  # fp32 values dequantized at a time on a CPU: about one L2 cache
_PACK_ROWS = 4096  # rows split and laid out at a time


def split_codes(codes: torch.Tensor, scale: torch.Tensor,
                zero: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int8 codes (N, K) and per-group scales (N, G) -> the (N, 2K) 4-bit codes, scales and zeros
    whose int4 weight equals `scale * codes (+ zero)` (high nibbles' groups first, then the low
    nibbles', whose zero points carry `zero`)."""
    shifted = codes.to(torch.int16) + 128
    high, low = (shifted >> 4).to(torch.uint8), (shifted & 15).to(torch.uint8)
    return (torch.cat([high, low], dim=1), *_split_scales(scale, zero))


def _split_scales(scale: torch.Tensor, zero: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's (N, 2G) scales and zeros: 16 d and 0 for the high halves, d and 8 d (+ zero)
    for the low ones."""
    scale = scale.float()
    low_zero = 8 * scale if zero is None else 8 * scale + zero.float()
    return torch.cat([16 * scale, scale], dim=1), torch.cat([torch.zeros_like(scale), low_zero], dim=1)


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Weight:
    """A weight (N, K) as int8 codes with one scale per group of input channels, held as the
    (N, 2K) 4-bit weight `split` (see the module's docstring)."""

    split: Int4Weight

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, group_size: int = 32,
                   dtype: torch.dtype = torch.bfloat16, zero: torch.Tensor | None = None) -> "Int8Weight":
        """From int8 codes (N, K) and scales (N, K/group_size): `w = scale * codes`, plus `zero`
        (N, K/group_size) when given (GGUF's Q5_1 / Q5_K: `d q + m` with q - 16 as the code)."""
        rows, cols = codes.shape
        if (codes.dtype != torch.int8 or cols % group_size or scale.shape != (rows, cols // group_size)
                or (zero is not None and zero.shape != scale.shape)):
            raise ValueError(f"Int8Weight: need int8 codes (N, K) and scales (and zeros) (N, K/{group_size}), got "
                             f"{codes.dtype} {tuple(codes.shape)} and {tuple(scale.shape)}")
        tile = tile_rows(2 * cols) if codes.device.type == "cpu" else None
        if tile is None or rows % tile:
            return cls(Int4Weight.from_codes(*split_codes(codes, scale, zero), group_size, dtype).kernel_only())
        # The kernel's tile layout written a few rows at a time (`int4_tiles`: checked against torch's
        # packer), where the packer would take int32 codes of the whole split (16 bytes a weight).
        kernel = torch.empty(rows, cols, dtype=torch.uint8)
        step = max(tile, _PACK_ROWS // tile * tile)
        for start in range(0, rows, step):
            halves = split_codes(codes[start:start + step], scale[start:start + step])[0]
            kernel[start:start + step] = tiles_from_unpacked(halves, tile)
        scales, zeros = _split_scales(scale, zero)
        scale_zero = torch.stack([scales.t(), zeros.t()], dim=-1)
        return cls(Int4Weight(None, scale_zero.to(dtype).contiguous(), group_size, kernel))

    @classmethod
    def cat(cls, weights: list["Int8Weight"]) -> "Int8Weight":
        """The weights stacked along the output dim (each row keeps its two halves): one fused call."""
        return cls(Int4Weight.cat([w.split for w in weights]))

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.split.shape
        return (rows, cols // 2)

    @property
    def dtype(self) -> torch.dtype:
        return self.split.dtype

    @property
    def device(self) -> torch.device:
        return self.split.device

    @property
    def group_size(self) -> int:
        return self.split.group_size

    @property
    def nbytes(self) -> int:
        return self.split.nbytes

    def can_run_fused(self, x: torch.Tensor) -> bool:
        return self.split.can_run_fused(x)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) @ w.T with the fused kernel (x in `dtype`, on `device`)."""
        return self.split.matmul(torch.cat([x, x], dim=-1))

    def dequantize(self, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The dense (N, K) weight in `dtype` (default: the scales' dtype): `d * q` computed exactly
        in fp32 (plus the zero point, where there is one) and rounded once; into `out` when given,
        or, when `out` is a function, handed to it a few rows at a time: `out(start, stop, fp32 rows)`.
        A few rows at a time: the int8 codes are joined back from the halves' nibbles, then scaled
        by the low halves' scales (d)."""
        rows, cols = self.shape
        if out is None:
            out = torch.empty(rows, cols, dtype=dtype or self.dtype, device=self.device)
        low = self.split.scale_zero[cols // self.group_size:]  # (K/g, N, 2): the low halves' d, 8 d + zero
        scale = low[..., 0].t()
        zero = low[..., 1].t().float() - 8 * scale.float()  # exactly 0 for Q8_0 / Q5_0
        zero = zero if bool(zero.any()) else None
        step = rows if self.device.type != "cpu" else max(64, _DEQUANT_CHUNK_BYTES // (4 * cols) // 64 * 64)
        values = torch.empty(min(step, rows), cols, device=self.device)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            v = values[:stop - start]
            self._codes_into(v, start, stop)  # int8 -> fp32, exact
            groups = v.view(stop - start, -1, self.group_size).mul_(scale[start:stop, :, None])
            if zero is not None:
                groups.add_(zero[start:stop, :, None])
            if callable(out):  # handed the chunk's fp32 rows
                out(start, stop, v)
            else:
                out[start:stop].copy_(v)
        return out

    def _codes_into(self, v: torch.Tensor, start: int, stop: int) -> None:
        """The int8 codes of output rows start .. stop, as numbers into `v`. In the kernel's tile
        layout a byte of the high halves' columns holds h of rows j and j + t/2 of a tile, the same
        byte of the low halves' columns their l; 16 h + l is q + 128, which XOR 128 reads as q."""
        s, cols = self.split, self.shape[1]
        if s.codes is not None:
            halves = unpack_codes(s.codes[start:stop])
            v.copy_(((halves[:, :cols] << 4) | halves[:, cols:]).bitwise_xor_(128).view(torch.int8))
            return
        tile = tile_rows(2 * cols)
        tiles = s.kernel_codes.view(-1, 2 * cols, tile // 2)[start // tile:stop // tile]  # (n, 2K, t/2)
        high, low = tiles[:, :cols], tiles[:, cols:]
        both = torch.empty(len(tiles), 2, cols, tile // 2, dtype=torch.uint8, device=v.device)
        torch.bitwise_left_shift(high, 4, out=both[:, 0])  # rows j of each tile
        both[:, 0].bitwise_or_(low & 15)
        torch.bitwise_and(high, 240, out=both[:, 1])  # rows t/2 + j
        both[:, 1].bitwise_or_(low >> 4)
        both.bitwise_xor_(128)
        v.view(len(tiles), 2, tile // 2, cols).copy_(both.view(torch.int8).transpose(2, 3))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Int8Weight":
        return Int8Weight(self.split.to(device, non_blocking=non_blocking))

    def to_tensors(self, prefix: str = "", with_kernel: bool = False) -> dict[str, torch.Tensor]:
        """Flat dict for safetensors (`Int4Weight.to_tensors` of the split, under `<prefix>int8.`)."""
        return self.split.to_tensors(f"{prefix}int8.", with_kernel)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> "Int8Weight":
        return cls(Int4Weight.from_tensors(tensors, f"{prefix}int8."))

    @staticmethod
    def is_stored(tensors, prefix: str = "") -> bool:
        return Int4Weight.is_stored(tensors, f"{prefix}int8.")

    def __repr__(self) -> str:
        return (f"Int8Weight(shape={self.shape}, group_size={self.group_size}, dtype={self.dtype}, "
                f"nbytes={self.nbytes}, device={self.device})")
