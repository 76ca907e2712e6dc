"""The 6-bit form of an `Int8Weight` (codes in [-32, 31]: GGUF's Q6_K): the codes' low nibbles in
the int4 tiles, a plane of their high two bits laid out as those tiles, and the split's low
halves' scale-zero pairs, 8 bits a weight where the split holds 12 (7 where each zero is 8 times
its scale, Q6_K's: the scales alone, `scales_alone`; the "q6_k" cases). It holds the split's values;
our kernel, in every variant this CPU has and in both of torch's tile layouts, gives it the split's
bits in decode (8- and 16-bit x, 1 to 13 rows) and prompts, codes at the edges of their high bits
included; everywhere else (a device, safetensors, stacking, a piece of a table) it falls back to
what still gives those values."""
from __future__ import annotations

import pytest
import torch

from flexlamps.kernels import tile_gemv
from flexlamps.models.blocks import linear as lin
from quant import int8_weight
from quant.int4_tiles import tile_rows, tiles_from_unpacked
from quant.int8_weight import Int8Weight, high_plane, plane_tiles
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel

LEVELS = levels(tile_gemv.KERNEL)
needs_tiles = pytest.mark.skipif(tile_rows(256) not in (32, 64), reason="torch's CPU int4 tiles here are unknown")
# codes at each edge of the high two bits (u = q + 32: 0, 15 | 16, 31 | 32, 47 | 48, 63) and between
EDGES = torch.tensor([-32, -17, -16, -1, 0, 15, 16, 31, -30, 5], dtype=torch.int8)


def _codes(rows: int = 192, cols: int = 256, group: int = 16, seed: int = 0, with_zero: bool = False):
    gen = torch.Generator().manual_seed(seed)
    codes = EDGES[torch.randint(0, len(EDGES), (rows, cols), generator=gen)]
    codes[0], codes[1] = -32, 31  # whole rows at the two ends
    scale = torch.rand(rows, cols // group, generator=gen) / 64 + 1e-3
    zero = torch.randn(rows, cols // group, generator=gen) / 64 if with_zero else None
    return codes, scale, zero


def _forms(rows: int = 192, cols: int = 256, group: int = 16, dtype=torch.bfloat16, with_zero: bool = False):
    codes, scale, zero = _codes(rows, cols, group, with_zero=with_zero)
    split = Int8Weight.from_codes(codes, scale, group, dtype, zero=zero)
    six = Int8Weight.from_codes(codes, scale, group, dtype, zero=zero, six_bit=True)
    assert six.high is not None and split.high is None and six.shape == split.shape == (rows, cols)
    return split, six


def test_the_plane_holds_each_tile_bytes_high_bits_where_the_kernel_reads_them():
    tiles = torch.randint(0, 4, (64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    tiles = tiles | (torch.randint(0, 4, (64, 64), dtype=torch.uint8) << 4)
    plane = high_plane(tiles)
    assert plane.shape == (64, 32) and torch.equal(plane_tiles(plane), tiles)
    one = torch.zeros(64, 64, dtype=torch.uint8)
    one.view(-1)[64 * 3 + 32 + 5] = 0x20  # tile byte 64b + 32 + i (b = 3, i = 5), its high nibble 2
    assert high_plane(one).view(-1).nonzero().view(-1).tolist() == [32 * 3 + 5]
    assert int(high_plane(one).view(-1)[32 * 3 + 5]) == 2 << 6  # bits 6-7: the second byte's high nibble


@needs_tiles
@pytest.mark.parametrize("with_zero", [False, True], ids=["q6_k", "zero"])
def test_the_splits_values_in_two_thirds_of_its_bytes(with_zero):
    split, six = _forms(with_zero=with_zero)
    assert torch.equal(six.dequantize(torch.float32), split.dequantize(torch.float32))
    rows, cols = six.shape
    assert six.nbytes == rows * cols // 2 + rows * cols // 4 + six.split.scale_zero.nbytes
    # 8 bits a weight against 12 (groups of 16); 7 where the zeros are 8 times the scales (Q6_K): the scales alone
    assert six.scales_alone == (not with_zero)
    assert 8 * six.nbytes == (8 if with_zero else 7) * rows * cols and 8 * split.nbytes == 12 * rows * cols
    assert not six.can_run_fused(torch.zeros(1, cols, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="6-bit"):
        six.matmul(torch.zeros(1, cols, dtype=torch.bfloat16))


@needs_tiles
def test_codes_that_do_not_fit_stay_the_split():
    codes, scale, _ = _codes()
    codes[5, 7] = -33
    assert Int8Weight.from_codes(codes, scale, 16, six_bit=True).high is None
    assert Int8Weight.from_codes(codes.clamp(-32, 31), scale, 16, six_bit=False).high is None


def _assert_split_bits(kernel: tile_gemv.TileGemv, split: Int8Weight, six: Int8Weight, dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    for rows in (1, 2, 3, 5, 8, 13, 35):  # 8 and 13: decode calls of many rows take the prompt kernel; 35: 16-bit
        # x's first 32 on the AMX tiles (the amx variant)
        x = (torch.randn(rows, six.shape[1], generator=gen) * 3).to(dtype)
        x[0, :16] = 0
        assert kernel.runs(six, x)
        assert torch.equal(kernel.matmul(six, x), kernel.matmul(split, x)), rows
        if kernel.runs_prompt(six, x) and kernel.x_bits == 8:
            assert torch.equal(kernel.prompt_product(six, x), kernel.prompt_product(split, x)), rows


@needs_tiles
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [8, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,cols,group,with_zero", [(192, 256, 16, False), (64, 512, 32, True), (50, 256, 16, False),
                                                     (33, 256, 8, False), (2, 96, 48, True)])
def test_the_kernel_gives_the_splits_bits(level, x_bits, dtype, rows, cols, group, with_zero):
    """50 and 33 rows: the last tile padded (33: one real row in it; 2: the only tile). Groups of 8:
    tiles of 32 take the two-half path on the plane (not whole 16s); groups of 48: the joined path
    at every row count (the prompt kernel takes no such group)."""
    kernel = tile_gemv.TileGemv(variant_kernel(tile_gemv.KERNEL, level).library, level, x_bits)
    split, six = _forms(rows, cols, group, dtype, with_zero)
    _assert_split_bits(kernel, split, six, dtype)


@needs_tiles
@pytest.mark.parametrize("level", LEVELS)
def test_a_row_keeps_its_bits_alone_and_on_two_threads(level):
    library = variant_kernel(tile_gemv.KERNEL, level).library
    _, six = _forms()
    x = torch.randn(9, six.shape[1], generator=torch.Generator().manual_seed(4)).bfloat16()
    for x_bits in (8, 16):
        kernel = tile_gemv.TileGemv(library, level, x_bits)
        assert_rows_alone_as_together(lambda w, x_: kernel.matmul(w, x_), [six], x)
    kernel = tile_gemv.TileGemv(library, level, 8)
    assert_rows_alone_as_together(lambda w, x_: kernel.prompt_product(w, x_), [six], x)


@needs_tiles
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [8, 16])
def test_tiles_of_64_rows_give_the_splits_bits(level, x_bits, monkeypatch):
    """torch lays 4-bit codes out in tiles of 64 rows on AVX-512 builds, of 32 on AVX2 ones: both
    forms made in tiles of 64 here (where the kernel is told so), the same bits."""
    library = variant_kernel(tile_gemv.KERNEL, level).library
    if 64 not in tile_gemv.TileGemv(library, level).tiles:
        pytest.skip(f"{level} takes tiles of {tile_gemv.TILES[level]} rows")
    for module in (int8_weight, tile_gemv):
        monkeypatch.setattr(module, "tile_rows", lambda cols: 64)
    split, six = _forms(128, 512)
    low = (split.dequantize(torch.float32) / split._scale_zero()[0].float().repeat_interleave(16, 1)).round()
    assert torch.equal(six.split.kernel_codes, tiles_from_unpacked((low + 32).to(torch.uint8) & 15, 64))
    _assert_split_bits(tile_gemv.TileGemv(library, level, x_bits), split, six, torch.bfloat16)


@needs_tiles
@pytest.mark.parametrize("with_zero", [False, True], ids=["q6_k", "zero"])
def test_it_moves_stores_stacks_and_slices_as_the_split_does(with_zero):
    split, six = _forms(with_zero=with_zero)
    values = split.dequantize(torch.float32)
    back = Int8Weight.from_tensors(six.to_tensors(with_kernel=True))
    assert back.high is not None and back.scales_alone == six.scales_alone == (not with_zero)
    assert torch.equal(back.dequantize(torch.float32), values)
    assert torch.equal(Int8Weight.from_tensors(six.to_tensors()).dequantize(torch.float32), values)
    assert six.as_split().high is None and torch.equal(six.as_split().dequantize(torch.float32), values)
    both = Int8Weight.cat([six, six])
    assert both.high is not None and torch.equal(both.dequantize(torch.float32), torch.cat([values, values]))
    assert both.scales_alone == six.scales_alone
    assert Int8Weight.cat([six, split]).high is None
    other = _forms(with_zero=not with_zero)[1]  # one holds its scales alone, the other pairs: stacked as pairs
    mixed = Int8Weight.cat([six, other])
    assert mixed.high is not None and not mixed.scales_alone
    assert torch.equal(mixed.dequantize(torch.float32), torch.cat([values, other.dequantize(torch.float32)]))
    tile = tile_rows(256)
    piece = six.rows(tile, 192)
    assert piece.high is not None and piece.scales_alone == six.scales_alone
    assert torch.equal(piece.dequantize(torch.float32), values[tile:])
    assert torch.equal(six.rows(1, 3).dequantize(torch.float32), values[1:3])
    moved = six.to("meta")
    assert moved.high is None and moved.shape == six.shape


@needs_tiles
def test_gguf_q6_k_is_held_in_it_where_our_kernel_runs(monkeypatch):
    from flexlamps.models.loading import in_place
    codes, scale, _ = _codes(64, 256)
    kernel = lin.native_kernel()
    assert in_place.packs_six_bit() == (kernel is not None)
    assert (in_place.int8_from_blocks(codes, scale, None, torch.bfloat16).high is not None) == (kernel is not None)
    assert in_place.int8_from_blocks(codes, scale, None, torch.bfloat16).scales_alone == (kernel is not None)
    monkeypatch.setattr(in_place, "native_kernel", lambda: None)
    assert in_place.int8_from_blocks(codes, scale, None, torch.bfloat16).high is None


@pytest.mark.slow  # ~30 s: a model loaded twice
@pytest.mark.ci
def test_a_q4_k_m_model_holds_its_q6_k_and_q5_0_in_it_with_the_splits_logits(tmp_path, monkeypatch):
    """A llama GGUF in llama.cpp's Q4_K_M mix (attn_v Q5_0, ffn_down Q6_K): where our kernel runs,
    those matrices are held in the 6-bit form, and every step's logits (a prompt, decode steps on
    the native loop) are the bits they are with them held as the split (Q6_K with the 6-bit form's
    scales: its own form's super-block products are test_q6_k_form's)."""
    from flexlamps import LLM
    from flexlamps.engine.executors.step import Step
    from flexlamps.models.loading import in_place
    from tests.checkpoint_zoo import CheckpointZoo

    if lin.native_kernel() is None:
        pytest.skip("our decode kernel does not run here")
    path = str(CheckpointZoo(tmp_path).path("gguf:llama:Q4_K_M"))
    monkeypatch.setattr(in_place, "keeps_q6_k_scales", lambda: False)

    def logits(expect_six: bool) -> list[torch.Tensor]:
        executor = LLM(path, dtype="bfloat16", max_batch_size=2, cache_dir=False).executor
        held = [w.int4 if hasattr(w, "int4") else w for layer in executor.layer_weights for w in layer.values()]
        int8 = [w for w in held if isinstance(w, Int8Weight)]
        # (Q5_0 codes are held in the 5-bit form instead where our AVX-512 variant runs)
        assert int8 and all((w.high is not None) == expect_six for w in int8 if w.fifth is None)
        cache, ids = executor.new_cache(2, 12), torch.randint(3, 200, (2, 11), generator=torch.Generator().manual_seed(0))
        steps = [Step(ids[:, :8], torch.arange(8).expand(2, -1), torch.arange(2))]
        steps += [Step(ids[:, i:i + 1], torch.full((2, 1), i), torch.arange(2)) for i in range(8, 11)]
        return [executor.forward_steps(cache, [step])[0] for step in steps]

    six = logits(True)
    monkeypatch.setattr(in_place, "packs_six_bit", lambda: False)
    assert all(torch.equal(a, b) for a, b in zip(six, logits(False)))
