"""Byte sizes of FP8 storage layouts; torch-free so `placement` can size them.

FP8 here is `float8_e4m3fn` (largest finite value 448) with one fp32 scale per block of
consecutive values, the format of DeepSeek-V3's checkpoints (128x128 weight tiles) and of
its FP8 latent cache (FlashMLA / ESS: per token per layer, the 512-wide latent in FP8 with 4
scales, then the 64 rotary dims in bf16 — 656 B; the indexer key in FP8 with one scale, 132 B).
"""

from __future__ import annotations

import math

FP8_SCALE_BYTES = 4  # one fp32 scale per block
WEIGHT_BLOCK = (128, 128)  # DeepSeek-V3's `weight_block_size`
CACHE_BLOCK = 128  # values per scale in a cached latent or indexer key
ROPE_BYTES = 2  # the rotary dims stay bf16: FP8 would ruin relative positions


def fp8_vector_bytes(width: int, block: int = CACHE_BLOCK) -> int:
    """Bytes of one `width`-long vector stored in FP8 with a scale per `block` values."""
    return width + math.ceil(width / block) * FP8_SCALE_BYTES


def latent_record_bytes(kv_lora_rank: int, rope_dim: int, block: int = CACHE_BLOCK) -> int:
    """Bytes one token's FP8 latent entry takes per layer (656 for DeepSeek-V3.2)."""
    return fp8_vector_bytes(kv_lora_rank, block) + rope_dim * ROPE_BYTES


def fp8_weight_bytes(rows: int, cols: int, block: tuple[int, int] = WEIGHT_BLOCK) -> int:
    """Bytes of a (rows, cols) FP8 weight with one fp32 scale per block tile."""
    return rows * cols + math.ceil(rows / block[0]) * math.ceil(cols / block[1]) * FP8_SCALE_BYTES
