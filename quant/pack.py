"""Two 4-bit codes per byte: `pack_nibbles` / `unpack_nibbles`.

Layout ("split halves"): for n codes, m = ceil(n/2); byte j holds code j in its low
nibble and code j + m in its high nibble (zero when j + m == n). Unpacking is then two
contiguous, fully vectorized ops (`p & 15` into the first half, `p >> 4` into the second)
instead of an interleave, which measured ~10x faster on CPU than packing neighbours
(2j, 2j+1) into one byte. Imports torch only.
"""
from __future__ import annotations

import torch


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes in [0, 15] (any shape, flattened) into 1-D uint8 of ceil(n/2) bytes."""
    flat = codes.reshape(-1)
    half = (flat.numel() + 1) // 2
    low, high = flat[:half], flat[half:]
    if high.numel() < half:  # odd count: the last byte's high nibble is padding
        high = torch.cat([high, high.new_zeros(half - high.numel())])
    return low | (high << 4)


def unpack_nibbles(packed: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse of `pack_nibbles`: 1-D uint8 codes, `numel` of them.

    Args:
        packed: 1-D uint8 of ceil(numel/2) bytes.
        numel: number of codes packed.
        out: optional uint8 buffer of at least 2*len(packed) elements, reused to avoid
            an allocation on the decode path.
    """
    half = packed.numel()
    if out is None:
        out = torch.empty(2 * half, dtype=torch.uint8, device=packed.device)
    torch.bitwise_and(packed, 15, out=out[:half])
    torch.bitwise_right_shift(packed, 4, out=out[half : 2 * half])
    return out[:numel]


def unpack_nibbles_range(packed: torch.Tensor, numel: int, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
    """Codes `[start, stop)` of `numel` packed codes, written to `out[: stop - start]`.

    Lets a caller decompress a large tensor chunk by chunk through a small, cache-resident
    buffer. A range may straddle the split point; each side is one contiguous op.
    """
    half = packed.numel()
    low_stop = min(stop, half)
    if start < low_stop:
        torch.bitwise_and(packed[start:low_stop], 15, out=out[: low_stop - start])
    high_start = max(start, half)
    if high_start < stop:
        high = packed[high_start - half : stop - half]
        torch.bitwise_right_shift(high, 4, out=out[high_start - start : stop - start])
    return out[: stop - start]
