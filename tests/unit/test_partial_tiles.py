"""Weights whose output rows do not fill the kernels' last tile (a vocabulary of 32002, q/k/v of
head dims like 40): their codes are stored padded with code-0 rows to the tile, and both our
products (decode, `TileGemv.matmul`; prompts, `prompt_product`), in every variant this CPU has,
compute that tile whole and keep its real rows, with the bits those rows get inside a weight of
whole tiles. torch's int4 kernel, which cannot read the padded tiles, is not given them."""
from __future__ import annotations

import pytest
import torch

from flexlamps.kernels import tile_gemv
from quant.int4_tiles import tile_rows, tiles_from_unpacked
from quant.int4_weight import Int4Weight, unpack_codes
from quant.int8_weight import Int8Weight
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel

LEVELS = levels(tile_gemv.KERNEL)
COLS = 256
WHOLE = 192  # rows in whole tiles of 32 and of 64


def _int4(rows: int, group: int) -> Int4Weight:
    """The first `rows` rows of one 4-bit weight (the same codes, scales and zeros whatever `rows`)."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (WHOLE, COLS), dtype=torch.uint8, generator=gen)
    groups = (WHOLE, COLS // group)
    scale, zero = torch.rand(*groups, generator=gen) / 8, torch.randn(*groups, generator=gen) / 8
    return Int4Weight.from_codes(codes[:rows], scale[:rows], zero[:rows], group, torch.bfloat16)


def _int8(rows: int, group: int) -> Int8Weight:
    """The first `rows` rows of one int8 weight (Q8_0 in groups of 32, Q6_K-like in 16, zero points)."""
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(-128, 128, (WHOLE, COLS), dtype=torch.int8, generator=gen)
    groups = (WHOLE, COLS // group)
    scale, zero = torch.rand(*groups, generator=gen) / 64, torch.randn(*groups, generator=gen) / 64
    return Int8Weight.from_codes(codes[:rows], scale[:rows], group, torch.bfloat16, zero=zero[:rows])


WEIGHTS = {"int4-g32": lambda rows: _int4(rows, 32), "int4-g128": lambda rows: _int4(rows, 128),
           "int8-g32": lambda rows: _int8(rows, 32), "int8-g16": lambda rows: _int8(rows, 16)}


def _x(rows: int, seed: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, COLS, generator=gen) * torch.rand(rows, 1, generator=gen) * 4).to(torch.bfloat16)


def _assert_product(got: torch.Tensor, w, x: torch.Tensor, bits: int) -> None:
    """`got` is x rounded as the kernel rounds it times the weight, within one bf16 rounding of the
    output and the reordering of an fp32 sum (as test_tile_gemv checks whole tiles)."""
    rounded = tile_gemv.rounded_like_kernel(x, w.group_size, bits).double()
    dense = w.dequantize(torch.float32).double()
    want, size = rounded @ dense.t(), rounded.abs() @ dense.abs().t()
    assert got.shape == want.shape
    assert ((got.double() - want).abs() <= 2 ** -7 * want.abs() + COLS * 2 ** -24 * size).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", sorted(WEIGHTS))
@pytest.mark.parametrize("rows", [33, 50, 97])
def test_a_partial_last_tile_runs_on_the_codes_with_a_whole_tiles_bits(level, kind, rows):
    kernel = variant_kernel(tile_gemv.KERNEL, level)
    w, whole = WEIGHTS[kind](rows), WEIGHTS[kind](WHOLE)
    x = _x(25)
    assert kernel.runs(w, x) and kernel.runs_prompt(w, x)
    prompt = kernel.prompt_product(w, x)
    _assert_product(prompt, w, x, 8)
    assert torch.equal(prompt, kernel.prompt_product(whole, x)[:, :rows])
    for count in (1, 3, 9, 25):  # decode calls of few rows, and of many (laid out as prompts are)
        decode = kernel.matmul(w, x[:count])
        _assert_product(decode, w, x[:count], kernel.x_bits)
        assert torch.equal(decode, kernel.matmul(whole, x[:count])[:, :rows])
        if kernel.x_bits == 8:
            assert torch.equal(decode, prompt[:count])
    head = tile_gemv.TileGemv(kernel.library, level, 16)  # an output head's 16-bit x
    decode = head.matmul(w, x[:3])
    _assert_product(decode, w, x[:3], 16)
    assert torch.equal(decode, head.matmul(whole, x[:3])[:, :rows])
    assert_rows_alone_as_together(kernel.matmul, [w], x[:11])
    assert_rows_alone_as_together(kernel.prompt_product, [w], x[:11])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [33, 97])
def test_a_partial_tile_of_64_rows_in_both_products(level, rows):
    """torch's AVX-512 layout (tiles of 64) padded by hand, both products called on it directly:
    a partial tile of 64 holds sub-tiles of 32 rows whose halves lie 32 rows apart."""
    kernel, w = variant_kernel(tile_gemv.KERNEL, level), _int4(rows, 32)
    if 64 not in kernel.tiles:
        pytest.skip(f"{level} takes no tiles of 64")
    codes = torch.cat([unpack_codes(w.codes), torch.zeros(-rows % 64, COLS, dtype=torch.uint8)])
    tiles, x = tiles_from_unpacked(codes, 64), _x(9)
    common = (w.scale_zero.data_ptr(), x.data_ptr())
    for count, call in ((9, kernel._gemm), (1, kernel._fn), (9, kernel._fn)):  # prompt; decode of one row, of many
        out = torch.empty(count, rows, dtype=torch.bfloat16)
        shape = (rows, COLS, 32, count, 64, 0, tile_gemv.KIND_INT4)
        if call is kernel._gemm:
            assert call(tiles.data_ptr(), None, *common, out.data_ptr(), *shape, 1) == 0
        else:
            assert call(tiles.data_ptr(), None, *common, out.data_ptr(), *shape, 8, 1) == 0
        _assert_product(out, w, x[:count], 8)


def test_the_padding_is_held_alone_counted_and_not_given_to_torch():
    tile = tile_rows(COLS)
    if tile is None:
        pytest.skip("torch's CPU int4 layout is unknown here")
    plain, w = _int4(97, 32), _int4(97, 32).kernel_only()  # the tiles alone: what the engine holds
    padded = -(-97 // tile) * tile
    assert w.codes is None and w.shape == (97, COLS) and w.kernel_codes.shape == (padded, COLS // 2)
    assert w.nbytes == padded * COLS // 2 + w.scale_zero.nbytes  # the padding counted
    assert not w.can_run_fused(_x(1)) and _int4(WHOLE, 32).can_run_fused(_x(1))
    assert torch.equal(w.plain_codes(), plain.codes) and torch.equal(w.dequantize(), plain.dequantize())
    assert torch.equal(w.dequantize(), _int4(WHOLE, 32).dequantize()[:97])
    again = Int4Weight.from_tensors(w.to_tensors(with_kernel=True))
    assert torch.equal(again.kernel_codes, w.kernel_codes) and again.shape == w.shape
    stacked = Int4Weight.cat([w, _int4(50, 32)])
    assert stacked.shape == (147, COLS) and stacked.kernel_codes.shape[0] == -(-147 // tile) * tile
    assert torch.equal(w.rows(0, 50).kernel_codes, _int4(50, 32).kernel_codes)
    q6 = _int8(97, 16)  # int8 codes held as their split's tiles alone, dequantized without the padding
    assert q6.split.codes is None and torch.equal(q6.dequantize(), _int8(WHOLE, 16).dequantize()[:97])
