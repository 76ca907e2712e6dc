"""Q4_K's scales as the file holds them (`Int4Weight.from_k_blocks`): 4-bit codes, fp16 d and dmin a
super-block of 256 inputs and each group's 6-bit scale and min, 4.625 bits a weight where (scale,
zero) pairs in bf16 take 5. Its values are llama.cpp's (`d sc q - dmin m` in fp32, exactly what the
gguf package dequantizes), where the pairs rounded each group's scale and zero to bf16; our kernel
makes them in fp32 in every variant this CPU has, so a row gets the same bits in every variant, at
every row count, alone or beside others, in decode (8- and 16-bit x) and prompts, on a partial last
tile too; everywhere else (torch's kernel, a device, stacking beside pairs) it is the pairs. With
8-bit x our kernel rounds x per 256 inputs (one scale a super-block, as llama.cpp's Q8_K)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flexlamps.kernels import tile_gemv
from flexlamps.models.loading.gguf_blocks import q4_k_parts
from quant.int4_tiles import tile_rows
from quant.int4_weight import Int4Weight
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel
from tests.unit.test_gguf_kquants import random_k_blocks

LEVELS = levels(tile_gemv.KERNEL)
needs_tiles = pytest.mark.skipif(tile_rows(256) not in (32, 64), reason="torch's CPU int4 tiles here are unknown")


def _raw(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return random_k_blocks(np.random.default_rng(seed), rows, cols, "Q4_K")


def _form(rows: int = 128, cols: int = 512, dtype=torch.bfloat16, seed: int = 0) -> Int4Weight:
    return Int4Weight.from_k_blocks(*q4_k_parts(_raw(rows, cols, seed), (rows, cols)), dtype)


@pytest.mark.parametrize("shape", [(3, 256), (70, 768)])
def test_its_values_are_what_gguf_dequantizes_exactly(shape):
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    raw = _raw(*shape)
    w = Int4Weight.from_k_blocks(*q4_k_parts(raw, shape), torch.bfloat16)
    assert w.k_scales and w.shape == shape and w.group_size == 32
    want = torch.from_numpy(dequantize(raw, T.Q4_K).reshape(shape))
    assert torch.equal(w.dequantize(torch.float32), want)
    assert torch.equal(w.kernel_only().dequantize(torch.float32), want)
    pairs = w.pairs()  # torch's form: each group's scale and zero rounded to bf16
    assert not pairs.k_scales and pairs.scale_zero.shape == (shape[1] // 32, shape[0], 2)
    torch.testing.assert_close(pairs.dequantize(torch.float32), want, rtol=2 ** -7, atol=2 ** -7 * float(want.abs().max()))
    assert not torch.equal(pairs.dequantize(torch.float32), want)


def test_its_bytes_are_four_and_five_eighths_bits_a_weight():
    w = _form().kernel_only()
    rows, cols = w.shape
    assert 8 * w.scale_zero.nbytes == rows * cols * 5 // 8  # 10 16-bit planes a super-block of 256
    assert 8 * w.nbytes == rows * cols * (4 + 5 / 8)  # the codes in whole tiles and those planes
    assert w.pairs().scale_zero.nbytes == 8 * w.scale_zero.nbytes // 5  # the pairs: a bit a weight


@needs_tiles
def test_it_moves_stores_stacks_and_slices_as_the_pairs_do():
    w = _form(192, 512).kernel_only()
    values = w.dequantize(torch.float32)
    back = Int4Weight.from_tensors(w.to_tensors(with_kernel=True))
    assert back.k_scales and torch.equal(back.dequantize(torch.float32), values)
    assert torch.equal(Int4Weight.from_tensors(w.to_tensors()).dequantize(torch.float32), values)
    both = Int4Weight.cat([w, w])
    assert both.k_scales and torch.equal(both.dequantize(torch.float32), torch.cat([values, values]))
    mixed = Int4Weight.cat([w, w.pairs()])  # beside pairs: stacked as pairs
    assert not mixed.k_scales and torch.equal(mixed.dequantize(torch.float32)[192:], w.pairs().dequantize(torch.float32))
    piece = w.rows(64, 192)
    assert piece.k_scales and torch.equal(piece.dequantize(torch.float32), values[64:])
    assert not w.can_run_fused(torch.zeros(1, 512, dtype=torch.bfloat16))  # torch's kernel reads pairs
    moved = w.to("meta")
    assert not moved.k_scales and moved.shape == w.shape


def _product(kernel: tile_gemv.TileGemv, w: Int4Weight, x: torch.Tensor, prompt: bool) -> torch.Tensor:
    return kernel.prompt_product(w, x) if prompt else kernel.matmul(w, x)


@needs_tiles
@pytest.mark.parametrize("x_bits", [8, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [128, 100])  # 100: the last tile padded
def test_every_variant_gives_a_row_the_same_bits(x_bits, dtype, rows):
    """Decode at 1 to 35 rows (many rows take the prompt kernel, 16-bit x's first 32 the AMX tiles)
    and prompts: each variant's bits equal, and within a rounding of x times the exact weight."""
    w = _form(rows, 512, dtype).kernel_only()
    exact = w.dequantize(torch.float32)
    gen = torch.Generator().manual_seed(5)
    for count in (1, 2, 3, 5, 8, 13, 35):
        x = (torch.randn(count, 512, generator=gen) * 3).to(dtype)
        x[0, :32] = 0
        for prompt in (False, True):
            if prompt and x_bits == 16:
                continue
            got = [_product(tile_gemv.TileGemv(variant_kernel(tile_gemv.KERNEL, level).library, level, x_bits), w, x,
                            prompt) for level in LEVELS]
            assert all(torch.equal(g, got[0]) for g in got), (count, prompt)
            bits = 8 if prompt else x_bits  # 8-bit x: rounded per 256 inputs (Q8_K's), 16-bit per group
            want = tile_gemv.rounded_like_kernel(x, tile_gemv.x_group(w, bits), bits) @ exact.t()
            torch.testing.assert_close(got[0].float(), want, rtol=2 ** -7, atol=2 ** -8 * float(want.abs().max()))


@needs_tiles
@pytest.mark.parametrize("level", LEVELS)
def test_a_row_keeps_its_bits_alone_and_on_two_threads(level):
    library = variant_kernel(tile_gemv.KERNEL, level).library
    w = _form(100, 768).kernel_only()
    x = torch.randn(9, 768, generator=torch.Generator().manual_seed(4)).bfloat16()
    for x_bits in (8, 16):
        kernel = tile_gemv.TileGemv(library, level, x_bits)
        assert_rows_alone_as_together(lambda w_, x_: kernel.matmul(w_, x_), [w], x)
    kernel = tile_gemv.TileGemv(library, level, 8)
    assert_rows_alone_as_together(lambda w_, x_: kernel.prompt_product(w_, x_), [w], x)


@needs_tiles
def test_prompts_of_many_rows_give_a_row_its_bits_where_the_chain_rounds():
    """From 256 rows the AMX tiles sum a super-block's sc u x exactly in int32 (`amx_rows_planes`), which is
    the fp32 chain's sb wherever that chain stays under 2^24; a row and super-block that may pass it
    (x near its largest across the super-block) takes the chain. Weights at their largest (every u 15,
    sc and m 63) with such rows: each variant gives each row the bits it gets alone (one row: the
    groups' products) and the same bits as every other variant."""
    raw = _raw(64, 768).reshape(64, 3, 144)
    raw[:8, :, 4:] = 0xFF  # the packed sc / m and the codes at their largest: the chain passes 2^24
    w = Int4Weight.from_k_blocks(*q4_k_parts(raw.reshape(64, -1), (64, 768)), torch.bfloat16).kernel_only()
    x = (torch.randn(262, 768, generator=torch.Generator().manual_seed(7)) * 3).bfloat16()
    x[3], x[70, :256], x[261, 256:512] = 1.0, -2.0, 5.0  # codes +-127 ...
    x[3, ::32], x[70, :256:32], x[261, 256:512:32] = 0.25, -0.5, 1.25  # ... but one a group (+-32): odd sums
    got = []
    for level in LEVELS:
        kernel = tile_gemv.TileGemv(variant_kernel(tile_gemv.KERNEL, level).library, level, 8)
        assert_rows_alone_as_together(lambda w_, x_: kernel.prompt_product(w_, x_), [w], x)
        got.append(kernel.prompt_product(w, x))
    assert all(torch.equal(g, got[0]) for g in got)
