"""GGUF Q4_0 / Q4_1 / Q4_K blocks read as 4-bit codes with a scale and zero point per group of
32 inputs, and Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K blocks as int8 codes with a scale (and zero) per
group (of 32; of 16 for Q6_K).

A block covers 32 consecutive input channels of one row: an fp16 scale `d` (and for Q4_1 an
fp16 minimum `m`), then 16 bytes whose low nibbles are elements 0-15 and high nibbles 16-31
(ggml's `block_q4_0` / `block_q4_1`). Q4_0 means `d * (q - 8)`, Q4_1 `d * q + m`; both are
`(q - 8) * scale + zero` (zero 0, or `m + 8 d`), the layout of `quant.int4_weight.Int4Weight`.
A Q8_0 block is an fp16 `d` and 32 int8 codes `q` (`block_q8_0`), meaning `d * q`
(`quant.int8_weight.Int8Weight`); a Q5_0 block (`block_q5_0`: fp16 `d`, 32 fifth bits, then
nibbles as in Q4_0) means `d * (q - 16)` with q in [0, 31], int8 codes `q - 16`; Q5_1 adds an
fp16 `m` after `d` (`d q + m`: zero point `m + 16 d`).
A Q4_K super-block (`block_q4_K`, 256 inputs: fp16 `d` and `dmin`, 12 bytes packing eight 6-bit
scales `sc` and mins `m`, 128 bytes of nibbles) means `d sc_j * q - dmin m_j` in its eight
sub-blocks of 32: `(q - 8) * scale + zero` with scale `d sc_j`, zero `8 d sc_j - dmin m_j`;
Q5_K adds 32 bytes of fifth bits (int8 codes `q - 16`, zero `16 d sc_j - dmin m_j`).
A Q6_K super-block (`block_q6_K`, 256 inputs: 128 bytes of low nibbles, 64 of 2-bit high parts,
16 int8 sub-block scales `sc`, fp16 `d`) means `d sc_j (q - 32)` in its sixteen sub-blocks of 16:
int8 codes `q - 32`, scale `d sc_j` (exact in fp32), no zero; groups of 16, which only our
kernel (`flexlamps.kernels.tile_gemv`) multiplies in place, held in its 6-bit form there
(`models.loading.in_place.packs_six_bit`; torch's int4 kernel takes groups from 32: elsewhere such
a weight is dequantized for the dense GEMM).
The codes go from the file's bytes to the weight without a float detour. Other types (Q2_K,
Q3_K, the IQ types) are dequantized by the `gguf` package and computed dense.
"""

from __future__ import annotations

import numpy as np
import torch

from flexlamps.models.loading.gguf_codes import INT4_BLOCK_TYPES, INT8_BLOCK_TYPES

BLOCK = 32  # elements per group: a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 block, a Q4_K / Q5_K sub-block
_HEADER_BYTES = {"Q4_0": 2, "Q4_1": 4}  # fp16 d (+ fp16 m) before the 16 code bytes
SUPER_BLOCK = 256  # elements per Q4_K / Q5_K super-block
_Q4_K_BYTES = 144  # fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
_Q5_K_BYTES = 176  # the same, with 32 bytes of fifth bits before the nibbles
_Q6_K_BYTES = 210  # 128 bytes of low nibbles, 64 of high 2-bit parts, 16 int8 scales, fp16 d
Q6_K_GROUP = 16  # inputs per Q6_K sub-block: one scale each


def is_int4_block_type(type_name: str) -> bool:
    return type_name in INT4_BLOCK_TYPES


def is_int8_block_type(type_name: str) -> bool:
    return type_name in INT8_BLOCK_TYPES


def int4_blocks(data: np.ndarray, type_name: str, shape: tuple[int, int]):
    """Codes (N, K) uint8 and per-block scale and zero (N, K/32) fp32 from a tensor's raw bytes.

    Args:
        data: the tensor's bytes as the gguf package gives them, (N, K/32 * block bytes) uint8.
        type_name: "Q4_0", "Q4_1" or "Q4_K".
        shape: (N, K), the weight's PyTorch shape.
    """
    rows, cols = shape
    if type_name == "Q4_K":
        return _q4_k_blocks(data, rows, cols)
    header = _HEADER_BYTES[type_name]
    blocks = np.ascontiguousarray(data).reshape(rows, cols // BLOCK, header + BLOCK // 2)
    d = _fp16(blocks[..., 0:2])  # (N, K/32)
    codes = _block_nibbles(blocks[..., header:]).reshape(rows, cols)
    zero = _fp16(blocks[..., 2:4]) + 8 * d if type_name == "Q4_1" else np.zeros_like(d)
    return torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(zero)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """fp32 values of the fp16 numbers in the last dim's two bytes."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _block_nibbles(quads: np.ndarray) -> np.ndarray:
    """A 32-element block's codes from its 16 bytes: element j in byte j's low nibble, j + 16 in its high one."""
    return np.concatenate([quads & 15, quads >> 4], axis=-1)


def _q4_k_blocks(data: np.ndarray, rows: int, cols: int):
    """`int4_blocks` of a Q4_K tensor: each super-block's eight sub-blocks as groups of 32."""
    blocks = np.ascontiguousarray(data).reshape(rows, cols // SUPER_BLOCK, _Q4_K_BYTES)
    codes = _k_nibbles(blocks[..., 16:], rows, cols).reshape(rows, cols)
    return (torch.from_numpy(codes), *_k_scales_zeros(blocks, rows, cols, code_offset=8))


def q4_k_parts(data: np.ndarray, shape: tuple[int, int]):
    """A Q4_K tensor as the file holds it: codes (N, K) uint8, d and dmin (N, K/256) fp32 (fp16
    values) and the 6-bit scales and mins (N, K/32) fp32 (`quant.int4_weight.Int4Weight.from_k_blocks`)."""
    rows, cols = shape
    blocks = np.ascontiguousarray(data).reshape(rows, cols // SUPER_BLOCK, _Q4_K_BYTES)
    codes = _k_nibbles(blocks[..., 16:], rows, cols).reshape(rows, cols)
    d, dmin = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
    sc, m = (part.reshape(rows, cols // BLOCK) for part in _q4_k_scales_mins(blocks[..., 4:16]))
    return tuple(torch.from_numpy(np.ascontiguousarray(t)) for t in (codes, d, dmin, sc, m))


def _k_nibbles(qs: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A Q4_K / Q5_K tensor's 128 nibble bytes a super-block as (N, K/256, 8, 32): 32-byte chunk c
    holds sub-block 2c in its low nibbles, 2c + 1 in its high ones."""
    chunks = qs.reshape(rows, cols // SUPER_BLOCK, 4, 1, 32)
    return np.concatenate([chunks & 15, chunks >> 4], axis=3).reshape(rows, cols // SUPER_BLOCK, 8, 32)


def _k_scales_zeros(blocks: np.ndarray, rows: int, cols: int, code_offset: int):
    """A Q4_K / Q5_K super-block's `d sc_j q - dmin m_j` as scale `d sc_j` and zero
    `code_offset d sc_j - dmin m_j` per sub-block (N, K/32), for codes `q - code_offset`."""
    d, dmin = _fp16(blocks[..., 0:2])[..., None], _fp16(blocks[..., 2:4])[..., None]  # (N, K/256, 1)
    sc, m = _q4_k_scales_mins(blocks[..., 4:16])  # (N, K/256, 8) each
    scale = (d * sc).reshape(rows, cols // BLOCK)
    zero = (code_offset * scale - (dmin * m).reshape(rows, cols // BLOCK)).astype(np.float32)
    return torch.from_numpy(scale), torch.from_numpy(zero)


def _q4_k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's `get_scale_min_k4` for all eight sub-blocks: 6-bit scales and mins from 12 bytes
    (sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7; 4-7 in bytes 8-11's nibbles, their
    top two bits in the top bits of bytes 0-3 / 4-7)."""
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([low & 63, (rest & 15) | ((low >> 6) << 4)], axis=-1)
    m = np.concatenate([high & 63, (rest >> 4) | ((high >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), m.astype(np.float32)


def int8_blocks(data: np.ndarray, shape: tuple[int, int], type_name: str = "Q8_0"):
    """Codes (N, K) int8, per-group scales (N, K/g) fp32 and zero points (N, K/g) fp32 or None
    (`w = scale * code (+ zero)`; g = 32, or Q6_K_GROUP for Q6_K: K over the scales' columns)
    from a Q8_0 / Q5_0 / Q5_1 / Q5_K / Q6_K tensor's raw bytes, as the gguf package gives them
    ((N, K/32 * 34) uint8 for Q8_0)."""
    rows, cols = shape
    if type_name == "Q6_K":
        return _q6_k_blocks(np.ascontiguousarray(data), rows, cols)
    if type_name in _FIVE_BIT:
        return _FIVE_BIT[type_name](np.ascontiguousarray(data), rows, cols)
    blocks = np.ascontiguousarray(data).reshape(rows, cols // BLOCK, 2 + BLOCK)
    d = _fp16(blocks[..., 0:2])  # (N, K/32)
    codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return torch.from_numpy(codes), torch.from_numpy(d), None


def _five_bit_codes(low: np.ndarray, fifth: np.ndarray) -> torch.Tensor:
    """int8 codes q - 16 from 5-bit q's low nibbles and fifth bits (same shapes, uint8)."""
    return torch.from_numpy((low | (fifth << 4)).astype(np.int8) - 16)


def _q5_blocks(data: np.ndarray, rows: int, cols: int, with_min: bool):
    """Q5_0 (`d (q - 16)`) / Q5_1 (`d q + m`, zero m + 16 d): fp16 d (and m), then a
    little-endian uint32 whose bit j is element j's fifth bit, then nibbles as in Q4_0."""
    header = 4 if with_min else 2
    blocks = data.reshape(rows, cols // BLOCK, header + 4 + BLOCK // 2)
    d = _fp16(blocks[..., 0:2])
    qh = blocks[..., header:header + 4].copy().view("<u4")  # (N, K/32, 1)
    fifth = ((qh >> np.arange(BLOCK, dtype=np.uint32)) & 1).astype(np.uint8)
    codes = _five_bit_codes(_block_nibbles(blocks[..., header + 4:]), fifth).reshape(rows, cols)
    zero = torch.from_numpy(_fp16(blocks[..., 2:4]) + 16 * d) if with_min else None
    return codes, torch.from_numpy(d), zero


def _q5_k_blocks(data: np.ndarray, rows: int, cols: int):
    """Q5_K super-blocks (`block_q5_K`: fp16 d and dmin, 12 bytes of 6-bit scales and mins as in
    Q4_K, 32 bytes of fifth bits, 128 of nibbles): sub-block j's element l is nibble (low for
    even j) of byte 32 (j // 2) + l plus 16 times bit j of qh[l]; `d sc_j q - dmin m_j`, so the
    code q - 16 has scale `d sc_j` and zero `16 d sc_j - dmin m_j`."""
    blocks = data.reshape(rows, cols // SUPER_BLOCK, _Q5_K_BYTES)
    qh = blocks[..., 16:48][..., None, :]  # (N, K/256, 1, 32)
    fifth = (qh >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # (N, K/256, 8, 32)
    codes = _five_bit_codes(_k_nibbles(blocks[..., 48:], rows, cols), fifth).reshape(rows, cols)
    return (codes, *_k_scales_zeros(blocks, rows, cols, code_offset=16))


_Q6_K_ROWS = 4096  # rows decoded at a time: numpy's temporaries (~6 bytes a weight) stay a few MiB


def _q6_k_blocks(data: np.ndarray, rows: int, cols: int):
    """Q6_K super-blocks as int8 codes and each sub-block j's scale d sc_j (fp32, exact)."""
    codes, d, sc = q6_k_parts(data, (rows, cols))
    return codes, d.repeat_interleave(SUPER_BLOCK // Q6_K_GROUP, 1) * sc.float(), None


def q6_k_parts(data: np.ndarray, shape: tuple[int, int]):
    """A Q6_K tensor as the file holds it: codes q - 32 (N, K) int8, d (N, K/256) fp32 (fp16 values)
    and the sub-blocks' scales sc (N, K/16) int8 (`quant.int8_weight.Int8Weight.from_k6_blocks`).
    Each half of 128 elements takes 64 low-nibble bytes `ql` and 32 bytes `qh`; element 32 i + l
    (i < 4, l < 32) is the low (i even) or high nibble of ql[l] (i < 2) or ql[32 + l], plus 16 times
    bit 2i, 2i + 1 of qh[l]. Decoded _Q6_K_ROWS rows at a time into the result: a whole 128256 x 2048
    table's temporaries took ~1 GB beside it (a llama-3.2-1b GGUF's first load peaked at 3.3 GB)."""
    rows, cols = shape
    blocks = np.ascontiguousarray(data).reshape(rows, cols // SUPER_BLOCK, _Q6_K_BYTES)
    codes = torch.empty(rows, cols, dtype=torch.int8)
    for start in range(0, rows, _Q6_K_ROWS):
        part = blocks[start:start + _Q6_K_ROWS]
        count = len(part)
        ql = part[..., :128].reshape(count, -1, 2, 64)
        qh = part[..., 128:192].reshape(count, -1, 2, 1, 32)
        low = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=-2)
        high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # (count, K/256, 2, 4, 32)
        codes[start:start + count] = torch.from_numpy((low | (high << 4)).astype(np.int8) - 32).reshape(count, cols)
    sc = torch.from_numpy(blocks[..., 192:208].copy().view(np.int8).reshape(rows, cols // Q6_K_GROUP))
    return codes, torch.from_numpy(_fp16(blocks[..., 208:210]).astype(np.float32)), sc


_FIVE_BIT = {"Q5_0": lambda data, r, c: _q5_blocks(data, r, c, with_min=False),
             "Q5_1": lambda data, r, c: _q5_blocks(data, r, c, with_min=True),
             "Q5_K": _q5_k_blocks}


_MXFP4_BYTES = 17  # ggml's block_mxfp4: an e8m0 exponent, then 16 bytes of e2m1 codes


def mxfp4_blocks(data: np.ndarray, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml MXFP4 rows (`block_mxfp4`: an e8m0 byte, then 16 bytes whose low nibbles are elements
    0-15 and high nibbles 16-31) as `quant.mxfp4.Mxfp4Weight`'s codes (rows, cols / 2: elements
    2i and 2i+1 in one byte, low first, as gpt-oss's checkpoints pack them) and scales
    (rows, cols / 32). Same codes, same exponents: the same values."""
    rows, cols = shape
    blocks = np.ascontiguousarray(data).reshape(rows, cols // BLOCK, _MXFP4_BYTES)
    nibbles = blocks[..., 1:]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)  # (rows, nb, 32): elements in order
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return (torch.from_numpy(np.ascontiguousarray(packed).reshape(rows, cols // 2)),
            torch.from_numpy(np.ascontiguousarray(blocks[..., 0])))
