"""GGUF Q4_0 / Q4_1 blocks read as 4-bit codes with a scale and zero point per block, and Q8_0
blocks as int8 codes with a scale per block.

A block covers 32 consecutive input channels of one row: an fp16 scale `d` (and for Q4_1 an
fp16 minimum `m`), then 16 bytes whose low nibbles are elements 0-15 and high nibbles 16-31
(ggml's `block_q4_0` / `block_q4_1`). Q4_0 means `d * (q - 8)`, Q4_1 `d * q + m`; both are
`(q - 8) * scale + zero` (zero 0, or `m + 8 d`), the layout of `quant.int4_weight.Int4Weight`.
A Q8_0 block is an fp16 `d` and 32 int8 codes `q` (`block_q8_0`), meaning `d * q`
(`quant.int8_weight.Int8Weight`). The codes go from the file's bytes to the weight without a
float detour.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 32  # elements per Q4_0 / Q4_1 block
_HEADER_BYTES = {"Q4_0": 2, "Q4_1": 4}  # fp16 d (+ fp16 m) before the 16 code bytes
INT8_BLOCK_TYPE = "Q8_0"  # fp16 d, then 32 int8 codes


def is_int4_block_type(type_name: str) -> bool:
    return type_name in _HEADER_BYTES


def int4_blocks(data: np.ndarray, type_name: str, shape: tuple[int, int]):
    """Codes (N, K) uint8 and per-block scale and zero (N, K/32) fp32 from a tensor's raw bytes.

    Args:
        data: the tensor's bytes as the gguf package gives them, (N, K/32 * block bytes) uint8.
        type_name: "Q4_0" or "Q4_1".
        shape: (N, K), the weight's PyTorch shape.
    """
    rows, cols = shape
    header = _HEADER_BYTES[type_name]
    blocks = np.ascontiguousarray(data).reshape(rows, cols // BLOCK, header + BLOCK // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, K/32)
    quads = blocks[..., header:]  # (N, K/32, 16): element j low nibble, element j+16 high nibble
    codes = np.concatenate([quads & 15, quads >> 4], axis=-1).reshape(rows, cols)
    if type_name == "Q4_1":
        zero = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) + 8 * d
    else:
        zero = np.zeros_like(d)
    return torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(zero)


def int8_blocks(data: np.ndarray, shape: tuple[int, int]):
    """Codes (N, K) int8 and per-block scales (N, K/32) fp32 from a Q8_0 tensor's raw bytes
    (N, K/32 * 34) uint8, as the gguf package gives them."""
    rows, cols = shape
    blocks = np.ascontiguousarray(data).reshape(rows, cols // BLOCK, 2 + BLOCK)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, K/32)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return torch.from_numpy(codes), torch.from_numpy(d)
