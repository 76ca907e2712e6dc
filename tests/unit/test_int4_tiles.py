"""4-bit weights held in the CPU kernel's tile layout alone (`Int4Weight.kernel_only`): the
layout as torch's packer writes it, dequantized and multiplied to the same bits as a weight
holding both layouts, and the chunked dequantization equal to the one-pass group formula."""

import pytest
import torch

from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS, linear
from quant.int4_tiles import tile_rows, tiles_from_unpacked, unpacked_from_tiles
from quant.int4_weight import Int4Weight, unpack_codes

needs_tiles = pytest.mark.skipif(tile_rows(128) is None, reason="this torch build's int4 kernel layout is unknown")


def _weight(rows, cols, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Int4Weight.quantize(torch.randn(rows, cols, generator=g), group_size=32, dtype=dtype)


def _one_pass_dequantize(w: Int4Weight) -> torch.Tensor:
    """The group formula over the whole matrix at once (what the chunked loop must equal)."""
    rows, cols = w.shape
    groups = unpack_codes(w.plain_codes()).reshape(rows, cols // w.group_size, w.group_size).float()
    scale = w.scale_zero[..., 0].t().float()[..., None]
    offset = w.scale_zero[..., 1].t().float()[..., None] - 8 * scale
    return groups.mul_(scale).add_(offset).reshape(rows, cols)


@pytest.mark.parametrize("shape", [(64, 96), (320, 2048), (128, 8192)])
def test_chunked_dequantize_equals_the_one_pass_formula(shape):
    w = _weight(*shape)
    assert torch.equal(w.dequantize(torch.float32), _one_pass_dequantize(w))
    assert torch.equal(w.dequantize(), _one_pass_dequantize(w).to(torch.bfloat16))


@needs_tiles
def test_the_tile_layout_is_torchs():
    codes = torch.randint(0, 16, (192, 256), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    tile = tile_rows(256)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    assert torch.equal(tiles_from_unpacked(codes, tile), packed)
    assert torch.equal(unpacked_from_tiles(packed, 256, tile), codes)


@needs_tiles
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_only_weight_computes_the_same_bits(dtype):
    w = _weight(320, 256, dtype)
    alone = w.kernel_only()
    assert alone.codes is None and alone.shape == w.shape and alone.nbytes < w.nbytes
    assert torch.equal(alone.plain_codes(), w.codes)
    assert torch.equal(alone.dequantize(), w.dequantize())
    for rows in (1, 5, INT4_DENSE_FROM_ROWS):
        x = torch.randn(rows, 256, dtype=dtype)
        assert torch.equal(linear(x, alone), linear(x, w))


@needs_tiles
def test_kernel_only_weights_stack_and_round_trip():
    parts = [_weight(r, 128, seed=r).kernel_only() for r in (64, 192)]
    both = Int4Weight.cat(parts)
    assert both.codes is None
    assert torch.equal(both.dequantize(), torch.cat([p.dequantize() for p in parts]))
    back = Int4Weight.from_tensors(both.to_tensors("w.", with_kernel=True), "w.")
    assert back.codes is None and torch.equal(back.kernel_codes, both.kernel_codes)
    portable = Int4Weight.from_tensors(both.to_tensors("w."), "w.")  # without the kernel layout: codes
    assert torch.equal(portable.dequantize(), both.dequantize())


def test_weights_whose_rows_are_not_whole_tiles_are_held_as_padded_tiles():
    w = _weight(48, 64)  # not whole tiles of 32 or 64: the last one padded with code-0 rows
    alone, tile = w.kernel_only(), tile_rows(64)
    if tile is None:
        pytest.skip("torch's CPU int4 layout is unknown here")
    assert alone.codes is None and alone.shape == (48, 64) and alone.kernel_codes.shape == (-(-48 // tile) * tile, 32)
    assert torch.equal(alone.plain_codes(), w.codes) and torch.equal(alone.dequantize(), w.dequantize())
