"""Byte sizes of the 4-bit forms (`quant.int4_weight.Int4Weight`); torch-free so `--max-rss` and
`placement` can size them without torch.

Two forms of a group's parameters: (scale, zero) pairs in the compute dtype, a pair a group of
`group_size` inputs (torch's int4 kernels' form; a Q4_0 / Q4_1 block's), or Q4_K's scales as the
file holds them (`Int4Weight.from_k_blocks`): a super-block of K_SUPER inputs (K_GROUPS groups of
32) keeps K_PLANES 16-bit planes, its fp16 d and dmin and each group's 6-bit `sc | m << 8`
(flexlamps/kernels/tile_scales_k4.h). The codes take 4 bits a weight in either.
"""

from __future__ import annotations

K_SUPER, K_GROUPS, K_PLANES = 256, 8, 10
CODE_BITS = 4


def int4_params_nbytes(rows: int, cols: int, *, k_scales: bool, group_size: int = 32, dtype_bytes: int = 2) -> int:
    """Bytes of a (rows, cols) 4-bit weight's group parameters (`Int4Weight.scale_zero`): Q4_K's
    planes (`k_scales`), else a (scale, zero) pair of `dtype_bytes` each a group."""
    if k_scales:
        return cols // K_SUPER * K_PLANES * 2 * rows
    return cols // group_size * rows * 2 * dtype_bytes


def int4_bits_per_weight(*, k_scales: bool, group_size: int = 32, dtype_bytes: int = 2) -> float:
    """Bits a weight of the 4-bit form, codes and group parameters (4.625 for Q4_K's, 5 for bf16 pairs of 32)."""
    return CODE_BITS + 8 * int4_params_nbytes(1, K_SUPER, k_scales=k_scales, group_size=group_size,
                                              dtype_bytes=dtype_bytes) / K_SUPER
