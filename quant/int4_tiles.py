"""The CPU int4 kernel's tile layout, checked against torch once, so a 4-bit weight can be held
in that layout alone (no second, row-major copy of its codes) and still be dequantized fast.

torch's `_convert_weight_to_int4pack_for_cpu` (torch 2.13, AVX-512) lays an (N, K) weight of
codes out as (N/t, K, t/2) bytes for tiles of t = 64 output rows: byte (tile, k, j) holds row
tile*t + j in its low nibble and row tile*t + t/2 + j in its high nibble, column k. That layout
is torch's internal business and may differ by build and CPU, so `tile_rows` compares it with
torch's own packer on random codes and answers None where it does not hold (callers then keep
row-major codes). Undoing it is a byte transpose of each tile, which is cheap; what costs is
torch's packer itself, which is why weights that move between tiers keep the kernel's layout.
Imports torch only.
"""
from __future__ import annotations

import functools

import torch

_CANDIDATE_TILES = (64, 32, 16)


def tiles_from_unpacked(codes: torch.Tensor, tile: int) -> torch.Tensor:
    """(N, K) uint8 codes -> (N, K/2) bytes in the tile layout described above."""
    rows, cols = codes.shape
    halves = codes.reshape(rows // tile, 2, tile // 2, cols)  # (tiles, low/high half, t/2, K)
    packed = halves[:, 0] | (halves[:, 1] << 4)  # (tiles, t/2, K)
    # (tiles, K, t/2) flattened; contiguous: with one tile and K == t the reshape is a transposed view
    return packed.transpose(1, 2).reshape(rows, cols // 2).contiguous()


@functools.lru_cache(maxsize=None)
def tile_rows(cols: int) -> int | None:
    """Output rows per tile of the CPU kernel's layout for weights with `cols` input channels,
    or None when torch's packer does not produce the layout `tiles_from_unpacked` writes."""
    if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu") or cols % 2:
        return None
    rows = 2 * max(_CANDIDATE_TILES)
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    except RuntimeError:
        return None
    for tile in _CANDIDATE_TILES:
        if packed.shape == (rows, cols // 2) and torch.equal(packed, tiles_from_unpacked(codes, tile)):
            return tile
    return None


def unpack_tile_rows_into(out: torch.Tensor, kernel_codes: torch.Tensor, start: int, tile: int) -> None:
    """Codes of output rows start .. start + len(out) (from a tile's first row; the last tile may be
    a weight's partial one, padded to the tile) as numbers, row-major, into `out` (rows, K) of any
    dtype: the tiles' bytes are transposed back, then split in nibbles."""
    rows, cols = out.shape
    if rows % tile:  # the weight's last tile, its padding dropped
        whole = torch.empty(-(-rows // tile) * tile, cols, dtype=out.dtype, device=out.device)
        unpack_tile_rows_into(whole, kernel_codes, start, tile)
        out.copy_(whole[:rows])
        return
    tiles = kernel_codes.view(-1, cols, tile // 2)[start // tile:(start + rows) // tile]  # (n, K, t/2)
    back = tiles.transpose(1, 2).contiguous()  # (n, t/2, K): a byte transpose, cheap
    halves = out.view(rows // tile, 2, tile // 2, cols)
    torch.bitwise_and(back, 15, out=halves[:, 0])
    torch.bitwise_right_shift(back, 4, out=halves[:, 1])


def unpacked_from_tiles(kernel_codes: torch.Tensor, cols: int, tile: int) -> torch.Tensor:
    """Inverse of `tiles_from_unpacked`: (N, K/2) tile bytes -> (N, K) uint8 codes."""
    out = torch.empty(kernel_codes.shape[0], cols, dtype=torch.uint8, device=kernel_codes.device)
    unpack_tile_rows_into(out, kernel_codes, 0, tile)
    return out
