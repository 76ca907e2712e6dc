"""MXFP4 weights (OCP microscaling, as gpt-oss ships its experts): e2m1 4-bit codes, two per
byte (low nibble first), and one e8m0 scale (a power of two, exponent + 127) per block of 32
consecutive input values. weight = FP4_VALUES[code] * 2^(scale - 127).

The engine keeps such a matrix 4-bit on every tier (`Mxfp4Weight`: codes and scales; on disk
as those two uint8 tensors) and dequantizes it per call into a reused buffer (`models.linear`),
with transformers' own arithmetic (`integrations/mxfp4.py: convert_moe_packed_tensors`: the
table in the target dtype, then `torch.ldexp`), so the values are the ones transformers runs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from quant.compressed_weight import CompressedWeight

MXFP4_BLOCK = 32  # input values per e8m0 scale
# e2m1 codes 0..15: sign bit, 2 exponent bits, 1 mantissa bit (transformers' FP4_VALUES)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_UPCAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CHUNK_BLOCKS = 8192  # blocks of 32 dequantized at a time: the index temporaries stay small


def check_mxfp4(shape: tuple[int, int], codes_shape, scales_shape) -> None:
    """Raises ValueError unless codes (out, in / 2) and scales (out, in / 32) fit a (out, in) matrix."""
    rows, cols = shape
    if cols % MXFP4_BLOCK:
        raise ValueError(f"an MXFP4 matrix needs a multiple of {MXFP4_BLOCK} input columns, got {cols}")
    if tuple(codes_shape) != (rows, cols // 2) or tuple(scales_shape) != (rows, cols // MXFP4_BLOCK):
        raise ValueError(f"MXFP4 matrix {tuple(shape)} needs codes {(rows, cols // 2)} and scales "
                         f"{(rows, cols // MXFP4_BLOCK)}, got {tuple(codes_shape)} and {tuple(scales_shape)}")


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """codes (out, in / 2) uint8 and scales (out, in / 32) uint8 -> (out, in) in `dtype` (into `out`)."""
    rows, cols = codes.shape[0], codes.shape[1] * 2
    if out is None:
        out = torch.empty(rows, cols, dtype=dtype, device=codes.device)
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=codes.device)
    blocks = codes.reshape(-1, MXFP4_BLOCK // 2)  # (rows * in / 32, 16): one scale's codes per row
    exps = scales.reshape(-1, 1)
    flat = out.view(-1, MXFP4_BLOCK)
    for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        blk, sub = blocks[start:start + _CHUNK_BLOCKS], flat[start:start + _CHUNK_BLOCKS]
        sub[:, 0::2] = lut[(blk & 0x0F).to(torch.int)]
        sub[:, 1::2] = lut[(blk >> 4).to(torch.int)]
        torch.ldexp(sub, exps[start:start + _CHUNK_BLOCKS].to(torch.int32) - 127, out=sub)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Mxfp4Weight(CompressedWeight):
    """An MXFP4 (out, in) matrix kept as stored, dequantized to `dtype` (the compute dtype) per
    call. Stored on a tier as its codes and scales (`to_tensors`) and rebuilt from them."""

    KIND: ClassVar[str] = "mxfp4"
    PARTS: ClassVar[tuple[str, ...]] = ("codes", "scales")
    codes: torch.Tensor  # (out, in / 2) uint8: two e2m1 codes per byte, the lower input first
    scales: torch.Tensor  # (out, in / 32) uint8: e8m0 exponents, biased by 127
    dtype: torch.dtype

    def __post_init__(self):
        if self.codes.dtype != torch.uint8 or self.scales.dtype != torch.uint8 or self.dtype not in _UPCAST_DTYPES:
            raise ValueError(f"Mxfp4Weight needs uint8 codes and scales and a compute dtype in {_UPCAST_DTYPES}, "
                             f"got {self.codes.dtype}, {self.scales.dtype} and {self.dtype}")
        check_mxfp4(self.shape, self.codes.shape, self.scales.shape)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1] * 2)

    def dequantize(self, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        return dequantize_mxfp4(self.codes, self.scales, dtype or self.dtype, out)

    def _layout(self) -> list[int]:
        return [_UPCAST_DTYPES.index(self.dtype)]

    @classmethod
    def _from_parts(cls, parts: list[torch.Tensor], layout: list[int]) -> "Mxfp4Weight":
        return cls(*parts, _UPCAST_DTYPES[layout[0]])

    def __repr__(self) -> str:
        return f"Mxfp4Weight(shape={self.shape}, dtype={self.dtype}, device={self.device})"


def mxfp4_nbytes(shape: tuple[int, int]) -> int:
    """Bytes of an (out, in) MXFP4 matrix as stored (`to_tensors`: codes, scales, 4 B of layout)."""
    return shape[0] * shape[1] // 2 + shape[0] * shape[1] // MXFP4_BLOCK + 4
