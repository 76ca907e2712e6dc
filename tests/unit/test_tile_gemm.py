"""The prompt kernel on the codes (`TileGemv.prompt_product`, tile_gemm.h), in every variant this
CPU has: x rounded to int8 per group times the 4-bit or int8 codes where they lie, exact integer
sums (the largest codes included), a row's result independent of the rows beside it and of the
thread count, both of torch's tile layouts, and what it refuses."""
from __future__ import annotations

import pytest
import torch

from flexlamps.kernels import tile_gemv
from quant.int4_tiles import tiles_from_unpacked
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel

LEVELS = levels(tile_gemv.KERNEL)
ULP = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}  # one rounding of the output, as test_tile_gemv


def _kernel(level: str) -> tile_gemv.TileGemv:
    return variant_kernel(tile_gemv.KERNEL, level)


def _int4(rows: int, cols: int, group: int, dtype: torch.dtype, seed: int = 0) -> Int4Weight:
    gen = torch.Generator().manual_seed(seed)
    return Int4Weight.quantize(torch.randn(rows, cols, generator=gen), group, dtype).kernel_only()


def _int8(rows: int, cols: int, group: int, dtype: torch.dtype, low: int = -128, high: int = 128) -> Int8Weight:
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(low, high, (rows, cols), dtype=torch.int8, generator=gen)
    scale = torch.rand(rows, cols // group, generator=gen) / 64
    zero = torch.randn(rows, cols // group, generator=gen) / 64
    return Int8Weight.from_codes(codes, scale, group, dtype, zero=zero)


def _x(rows: int, cols: int, dtype: torch.dtype, seed: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    x[0, :16] = 0  # a group of zeros: scale 0, codes 0
    return x.to(dtype)


def _assert_product(got: torch.Tensor, w, x: torch.Tensor) -> None:
    """`got` is x rounded to int8 per group times the weight, within one rounding of the output and
    the reordering of an fp32 sum."""
    rounded = tile_gemv.rounded_like_kernel(x, w.group_size, 8).double()
    dense = w.dequantize(torch.float32).double()
    want, size = rounded @ dense.t(), rounded.abs() @ dense.abs().t()
    assert got.dtype == x.dtype and got.shape == want.shape
    err = (got.double() - want).abs()
    assert (err <= ULP[x.dtype] * want.abs() + x.shape[-1] * 2 ** -24 * size).all(), (err / size).max()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,group", [((64, 32), 32), ((192, 576), 32), ((96, 512), 128), ((64, 256), 64)])
def test_int4_is_x_in_int8_times_the_codes(level, dtype, shape, group):
    kernel, w = _kernel(level), _int4(*shape, group, dtype)
    assert kernel.runs_prompt(w, _x(1, shape[1], dtype))
    for rows in (1, 2, 3, 8):
        x = _x(rows, shape[1], dtype, seed=rows)
        _assert_product(kernel.prompt_product(w, x), w, x)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [32, 16])  # Q8_0's blocks, Q6_K's
def test_int8_is_x_in_int8_times_the_codes(level, dtype, group):
    kernel, w = _kernel(level), _int8(128, 576, group, dtype)
    assert kernel.runs_prompt(w, _x(1, 576, dtype))
    for rows in (1, 3, 6):
        x = _x(rows, 576, dtype, seed=rows)
        _assert_product(kernel.prompt_product(w, x), w, x)


@pytest.mark.parametrize("level", LEVELS)
def test_the_largest_codes_stay_exact(level):
    """Codes of -128 and 127 (int8: |q| and x signed by q) and of 15 over groups of 256 (4-bit: the
    16-bit sums are widened every 32 inputs) times x's largest codes; int8 codes of at most 16, 32, 33
    in magnitude, whose 16-bit sums are widened every 8, 4, 3 steps of 4 inputs (2 * 127 * |q| a step)."""
    kernel = _kernel(level)
    x = torch.ones(2, 512, dtype=torch.float16)
    x[1, ::2] = -1
    for code, group in ((-128, 32), (127, 32), (-16, 32), (-32, 16), (33, 32)):
        w = Int8Weight.from_codes(torch.full((64, 512), code, dtype=torch.int8), torch.full((64, 512 // group), 1 / 64),
                                  group, torch.float16)
        _assert_product(kernel.prompt_product(w, x), w, x)
    w4 = Int4Weight.from_codes(torch.full((64, 512), 15, dtype=torch.uint8), torch.full((64, 2), 1 / 64),
                               torch.zeros(64, 2), 256, torch.float16).kernel_only()
    _assert_product(kernel.prompt_product(w4, x), w4, x)


@pytest.mark.parametrize("level", LEVELS)
def test_a_row_does_not_depend_on_its_batch_or_the_threads(level):
    kernel = _kernel(level)
    weights = (_int4(320, 576, 32, torch.bfloat16), _int8(192, 576, 16, torch.bfloat16),
               _int8(192, 576, 16, torch.bfloat16, -32, 32))  # Q6_K's codes: two rows a pass, the odd row alone
    assert_rows_alone_as_together(kernel.prompt_product, weights, _x(7, 576, torch.bfloat16))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("group", [16, 32, 64, 128])
def test_rows_in_blocks_of_16_give_a_row_its_bits_alone(level, group):
    """Calls of 16 rows and more (the amx variant multiplies them on AMX tiles, 16 rows a tile, the
    last rows as the other variants do) give a row the bits it gets alone, and the avx512 variant's."""
    cols = 512 if group > 32 else 576
    weights = [_int4(96, cols, group, torch.bfloat16)]
    if group <= 32:  # int8 codes: Q8_0's, Q6_K's (split and 6-bit form)
        weights += [_int8(64, cols, group, torch.bfloat16), _int8(64, cols, group, torch.bfloat16, -32, 32)]
        codes = torch.randint(-32, 32, (64, cols), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
        weights.append(Int8Weight.from_codes(codes, torch.rand(64, cols // group) / 64, group, torch.bfloat16,
                                             six_bit=True))
    x = _x(37, cols, torch.bfloat16)
    assert_rows_alone_as_together(_kernel(level).prompt_product, weights, x)
    if level == "amx":  # (on a CPU with AMX, which has AVX-512)
        for w in weights:
            assert torch.equal(_kernel(level).prompt_product(w, x), _kernel("avx512").prompt_product(w, x))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("group", [16, 32])
def test_small_int8_codes_give_the_decode_products_bits(level, group):
    """int8 codes of at most 32 in magnitude (Q6_K's) are multiplied unsigned, biased by 64, their
    16-bit sums started at -64 times x's sums: the bits of the decode product, which multiplies the
    codes' 4-bit halves, one row a call."""
    kernel = tile_gemv.TileGemv(_kernel(level).library, level, x_bits=8)
    for low, high in ((-32, 33), (-16, 16)):
        w, x = _int8(64, 576, group, torch.bfloat16, low, high), _x(5, 576, torch.bfloat16)
        alone = torch.cat([kernel.matmul(w, row) for row in x.split(1)])
        assert torch.equal(kernel.prompt_product(w, x), alone)


@pytest.mark.parametrize("level", LEVELS)
def test_tiles_of_64_rows_give_the_tiles_of_32s_products(level):
    """torch lays 4-bit codes out in tiles of 64 rows on AVX-512 builds, of 32 on AVX2 ones: the
    prompt kernel reads either (here called directly on a layout of 64 made by hand)."""
    kernel, w = _kernel(level), _int4(128, 256, 32, torch.bfloat16)
    x = _x(5, 256, torch.bfloat16)
    codes = torch.randint(0, 16, (128, 256), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    w = Int4Weight.from_codes(codes, torch.rand(128, 8) / 8, torch.randn(128, 8) / 8, 32, torch.bfloat16)
    tiles64 = tiles_from_unpacked(codes, 64)
    out = torch.empty(5, 128, dtype=torch.bfloat16)
    assert kernel._gemm(tiles64.data_ptr(), None, w.scale_zero.data_ptr(), x.data_ptr(), out.data_ptr(), 128, 256, 32,
                        5, 64, 0, tile_gemv.KIND_INT4, 1) == 0
    _assert_product(out, w, x)
    assert torch.equal(out, kernel.prompt_product(w.kernel_only(), x))


@pytest.mark.parametrize("level", LEVELS)
def test_it_refuses_what_it_cannot_read(level):
    kernel = _kernel(level)
    x = _x(2, 576, torch.bfloat16)
    assert not kernel.runs_prompt(_int4(64, 576, 48, torch.bfloat16), _x(2, 576, torch.bfloat16))  # 48: not 32s
    assert not kernel.runs_prompt(_int4(64, 576, 32, torch.bfloat16), x.float())  # fp32 x
    w = _int4(64, 576, 32, torch.bfloat16)
    out = torch.empty(2, 64, dtype=torch.bfloat16)
    assert kernel._gemm(w.kernel_codes.data_ptr(), None, w.scale_zero.data_ptr(), x.data_ptr(), out.data_ptr(), 64, 576,
                        48, 2, 32, 0, tile_gemv.KIND_INT4, 1) == -1  # a group the layout of sums cannot take
