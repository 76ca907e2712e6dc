"""The 5-bit form of an `Int8Weight` (GGUF's Q5_0 / Q5_1 / Q5_K codes, in [-16, 15]): low nibbles
in the int4 tiles plus a plane of fifth bits, multiplied in place by our AVX-512 kernel only. It
holds the same values as the split (exactly without zero points, to one more rounding of them
with), the kernel multiplies it within its rounding of x, and everywhere else (stacking with a split,
safetensors, another device, no kernel) it falls back to what still gives those values."""

import pytest
import torch

from flexlamps.models.blocks import coded_weights, linear as lin
from quant.int4_tiles import tile_rows
from quant.int8_weight import FIVE_BIT_TILE, Int8Weight, fifth_bits, fifth_plane
from flexlamps.kernels.tile_gemv import rounded_like_kernel

needs_tiles = pytest.mark.skipif(tile_rows(256) != FIVE_BIT_TILE, reason="torch's CPU int4 tiles here are not 64 rows")


def _codes(rows=192, cols=256, seed=0, low=-16, high=16):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(low, high, (rows, cols), dtype=torch.int8, generator=g)
    scale = torch.rand(rows, cols // 32, generator=g) * 0.01 + 1e-3
    zero = torch.randn(rows, cols // 32, generator=g) * 0.01
    return codes, scale, zero


def test_the_plane_holds_every_bit_where_the_kernel_reads_it():
    bits = torch.randint(0, 2, (128, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    plane = fifth_plane(bits)
    assert plane.shape == (2, 8 * 96) and torch.equal(fifth_bits(plane, 96), bits)
    one = torch.zeros(64, 8, dtype=torch.uint8)
    one[16 * 2 + 5, 4 + 3] = 1  # register q = 2, row i = 5; columns 4..7 (the second word group), c = 3
    words = [int.from_bytes(bytes(w.tolist()), "little") for w in fifth_plane(one).view(-1, 8)]  # (k/4, q) order
    assert words == [1 << (4 * 5 + 3) if n == 4 * 1 + 2 else 0 for n in range(len(words))]


@needs_tiles
@pytest.mark.parametrize("with_zero", [False, True], ids=["q5_0", "q5_1"])
def test_same_values_as_the_split_and_a_third_fewer_bytes(with_zero):
    codes, scale, zero = _codes()
    zero = zero if with_zero else None
    five = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16, zero=zero, five_bit=True)
    split = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16, zero=zero)
    assert five.fifth is not None and split.fifth is None and five.shape == split.shape == (192, 256)
    assert five.nbytes < 0.62 * split.nbytes
    exact = codes.float() * scale.bfloat16().float().repeat_interleave(32, 1)
    if with_zero:
        exact += zero.bfloat16().float().repeat_interleave(32, 1)
        # the split rounds its zero point 8 d + zero once more (from the unrounded d and zero)
        atol = 2 ** -7 * float((8 * scale + zero.abs()).max())
        torch.testing.assert_close(split.dequantize(torch.float32), exact, rtol=0, atol=atol)
    assert torch.equal(five.dequantize(torch.float32), exact)
    assert torch.equal(five.as_split().dequantize(torch.float32), split.dequantize(torch.float32)) or with_zero
    assert not five.can_run_fused(torch.zeros(1, 256, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="5-bit"):
        five.matmul(torch.zeros(1, 256, dtype=torch.bfloat16))


@needs_tiles
def test_codes_or_rows_that_do_not_fit_stay_the_split():
    codes, scale, _ = _codes(low=-17, high=16)
    assert Int8Weight.from_codes(codes, scale, 32, five_bit=True).fifth is None  # a code of -17
    codes, scale, _ = _codes(rows=96)
    assert Int8Weight.from_codes(codes, scale, 32, five_bit=True).fifth is None  # 96 rows: no whole tiles


@needs_tiles
@pytest.mark.parametrize("rows", [1, 3, 5])
def test_the_kernel_multiplies_it_as_its_values(rows):
    kernel = lin.native_kernel()
    if kernel is None or not kernel.takes_five_bit:
        pytest.skip("our kernel does not run in its AVX-512 variant here (the 5-bit form's only)")
    codes, scale, zero = _codes(seed=rows)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(9)).bfloat16()
    for z in (None, zero):  # Q5_0, Q5_1
        five = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16, zero=z, five_bit=True)
        assert lin.fuses(five, x)
        want = rounded_like_kernel(x, 32, kernel.x_bits) @ five.dequantize(torch.float32).t()
        for got in (lin.fused_product(five, x), lin.linear(x, lin.with_dense_twin(five))):
            torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())


@needs_tiles
def test_without_our_kernel_it_runs_dense_on_its_values(monkeypatch):
    monkeypatch.setattr(coded_weights, "native_kernel", lambda: None)
    codes, scale, zero = _codes()
    five = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16, zero=zero, five_bit=True)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    assert not lin.fuses(five, x)
    want = x.float() @ five.dequantize(torch.bfloat16).float().t()
    for w in (five, lin.with_dense_twin(five)):
        torch.testing.assert_close(lin.linear(x, w).float(), want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())


@needs_tiles
def test_stacking_saving_and_moving_keep_the_values():
    codes, scale, zero = _codes()
    five = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16, zero=zero, five_bit=True)
    other = Int8Weight.from_codes(*_codes(rows=64, seed=4)[:2], 32, torch.bfloat16, five_bit=True)
    q8 = Int8Weight.from_codes(*_codes(rows=64, seed=5, low=-128, high=128)[:2], 32, torch.bfloat16)
    values = five.dequantize(torch.float32)
    both = Int8Weight.cat([five, other])
    assert both.fifth is not None
    assert torch.equal(both.dequantize(torch.float32), torch.cat([values, other.dequantize(torch.float32)]))
    mixed = Int8Weight.cat([other, q8])  # Q5_0 beside Q8_0 (a Q4_K_M's q/k and v): stacked as splits
    assert mixed.fifth is None
    assert torch.equal(mixed.dequantize(torch.float32), torch.cat([other.dequantize(torch.float32),
                                                                   q8.dequantize(torch.float32)]))
    for with_kernel in (True, False):
        back = Int8Weight.from_tensors(five.to_tensors("w.", with_kernel=with_kernel), "w.")
        assert back.fifth is not None and torch.equal(back.dequantize(torch.float32), values)
    assert five.to("cpu") is five
    moved = five.to("meta")  # leaves the CPU as the split
    assert moved.fifth is None and moved.shape == five.shape
