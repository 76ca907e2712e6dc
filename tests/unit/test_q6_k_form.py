"""Q6_K's scales as the file holds them (`Int8Weight.from_k6_blocks`): the 6-bit form's codes with fp16
d a super-block of 256 inputs and each group's int8 sc, 6 + 17/16 bits a weight. Its values are
llama.cpp's (`d sc q` in fp32, exactly what the gguf package dequantizes). With 8-bit x our kernel
rounds x per super-block (llama.cpp's Q8_K), sums sc q x exactly in int32 over the super-block and
takes one fp32 step a super-block, in every variant this CPU has: a row gets the same bits in every
variant, at every row count, alone or beside others, in decode and prompts (the AMX tiles' rows
too), on a partial last tile too. A head (16-bit x) and every other path take the 6-bit form's
scales (`pairs`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flexlamps.kernels import tile_gemv
from flexlamps.models.blocks.coded_weights import as_logits_head
from flexlamps.models.loading.gguf_blocks import q6_k_parts
from quant.int4_tiles import tile_rows
from quant.int8_weight import Int8Weight
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel
from tests.unit.test_gguf_kquants import random_k_blocks

LEVELS = levels(tile_gemv.KERNEL)
needs_tiles = pytest.mark.skipif(tile_rows(256) not in (32, 64), reason="torch's CPU int4 tiles here are unknown")


def _raw(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return random_k_blocks(np.random.default_rng(seed), rows, cols, "Q6_K")


def _form(rows: int = 128, cols: int = 512, dtype=torch.bfloat16, seed: int = 0) -> Int8Weight:
    return Int8Weight.from_k6_blocks(*q6_k_parts(_raw(rows, cols, seed), (rows, cols)), dtype)


@needs_tiles
@pytest.mark.parametrize("shape", [(3, 256), (70, 768)])
def test_its_values_are_what_gguf_dequantizes_exactly(shape):
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    raw = _raw(*shape)
    w = Int8Weight.from_k6_blocks(*q6_k_parts(raw, shape), torch.bfloat16)
    assert w.k_scales and not w.scales_alone and w.shape == shape and w.group_size == 16
    want = torch.from_numpy(dequantize(raw, T.Q6_K).reshape(shape))
    assert torch.equal(w.dequantize(torch.float32), want)
    pairs = w.pairs()  # the 6-bit form: each group's scale rounded to bf16
    assert not pairs.k_scales and pairs.scales_alone and pairs.split.scale_zero.shape == (shape[1] // 16, shape[0], 1)
    torch.testing.assert_close(pairs.dequantize(torch.float32), want, rtol=2 ** -7, atol=2 ** -7 * float(want.abs().max()))


@needs_tiles
def test_its_scales_take_a_sixteenth_bit_a_weight_more_than_the_6_bit_forms():
    w = _form()
    rows, cols = w.shape
    assert 8 * w.split.scale_zero.nbytes == rows * cols * 17 // 16  # 17 16-bit planes a super-block of 256
    assert 8 * w.nbytes == rows * cols * (6 + 17 / 16)  # the codes (nibbles, plane) in whole tiles and those planes
    assert 17 * w.pairs().split.scale_zero.nbytes == 16 * w.split.scale_zero.nbytes  # the 6-bit form's: a bf16 a group


@needs_tiles
def test_it_moves_stores_stacks_and_slices_as_the_6_bit_form_does():
    w = _form(192, 512)
    values = w.dequantize(torch.float32)
    back = Int8Weight.from_tensors(w.to_tensors(with_kernel=True))
    assert back.k_scales and torch.equal(back.dequantize(torch.float32), values)
    tile = tile_rows(512)
    both = Int8Weight.cat([w, w])
    assert both.k_scales and torch.equal(both.dequantize(torch.float32), torch.cat([values, values]))
    mixed = Int8Weight.cat([w, w.pairs()])  # beside the 6-bit form's scales: stacked as those
    assert not mixed.k_scales and torch.equal(mixed.dequantize(torch.float32)[192:], w.pairs().dequantize(torch.float32))
    piece = w.rows(tile, 192)
    assert piece.k_scales and torch.equal(piece.dequantize(torch.float32), values[tile:])
    assert not w.can_run_fused(torch.zeros(1, 512, dtype=torch.bfloat16))
    assert torch.equal(w.as_split().dequantize(torch.float32), w.pairs().dequantize(torch.float32))
    assert w.to("meta").shape == w.shape
    head = as_logits_head(w)
    assert head.x_bits == 16 and not head.k_scales and head.scales_alone


def _product(kernel: tile_gemv.TileGemv, w: Int8Weight, x: torch.Tensor, prompt: bool) -> torch.Tensor:
    return kernel.prompt_product(w, x) if prompt else kernel.matmul(w, x)


@needs_tiles
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [128, 100])  # 100: the last tile padded
def test_every_variant_gives_a_row_the_same_bits(dtype, rows):
    """Decode at 1 to 96 rows (from 6 or 8 rows the prompt kernel's passes; the AMX tiles for whole
    16s, from 32 rows with the planes of sc q) and prompts: each variant's bits equal, each row's the
    same at every count, and within a rounding of x per 256 times the exact weight (llama.cpp's Q8_K)."""
    w = _form(rows, 512, dtype)
    exact = w.dequantize(torch.float32)
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(96, 512, generator=gen) * 3).to(dtype)
    x[0, :256] = 0  # a super-block of zeros: dx 0
    x[1, 300] = 40  # one large input: that super-block's codes small
    kernels = [tile_gemv.TileGemv(variant_kernel(tile_gemv.KERNEL, level).library, level, 8) for level in LEVELS]
    first = None
    for count in (1, 2, 3, 5, 8, 13, 35, 48, 70, 96):
        for prompt in (False, True):
            got = [_product(kernel, w, x[:count], prompt) for kernel in kernels]
            assert all(torch.equal(g, got[0]) for g in got), (count, prompt)
            first = got[0][:1] if first is None else first
            assert torch.equal(got[0][:1], first), (count, prompt)  # row 0's bits at every count
            want = tile_gemv.rounded_like_kernel(x[:count], 256, 8) @ exact.t()
            torch.testing.assert_close(got[0].float(), want, rtol=2 ** -7, atol=2 ** -8 * float(want.abs().max()))


@needs_tiles
@pytest.mark.parametrize("level", LEVELS)
def test_a_row_keeps_its_bits_alone_and_on_two_threads(level):
    library = variant_kernel(tile_gemv.KERNEL, level).library
    w = _form(100, 768)
    x = torch.randn(67, 768, generator=torch.Generator().manual_seed(4)).bfloat16()  # (64 on the tiles' planes)
    kernel = tile_gemv.TileGemv(library, level, 8)
    assert_rows_alone_as_together(lambda w_, x_: kernel.matmul(w_, x_), [w], x)
    assert_rows_alone_as_together(lambda w_, x_: kernel.prompt_product(w_, x_), [w], x)


@needs_tiles
def test_16_bit_x_takes_the_6_bit_forms_scales_not_this_form():
    kernel = tile_gemv.TileGemv(variant_kernel(tile_gemv.KERNEL, LEVELS[0]).library, LEVELS[0], 16)
    w = _form(64, 256)
    assert not kernel.takes(w) and kernel.takes(w.pairs()) and kernel.takes_prompt(w)
    assert kernel.takes(as_logits_head(w))
