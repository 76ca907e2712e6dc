"""FP8 block storage: round trips within FP8 rounding, ESS's record sizes, checkpoint tiles."""

import pytest
import torch

from quant.fp8 import LatentRecords, dequantize_weight, quantize_blocks, dequantize_blocks, quantize_weight
from quant.fp8_layout import fp8_weight_bytes, latent_record_bytes

# float8_e4m3fn keeps 3 mantissa bits: a value moves by at most half a step, 2^-4 of its size,
# plus the subnormal floor (2^-9 of the block's largest value)
FP8_REL, FP8_FLOOR = 2.0 ** -4, 2.0 ** -9


def test_ess_record_sizes():
    assert latent_record_bytes(512, 64) == 656 == LatentRecords(512, 64).record_bytes
    assert LatentRecords(128).record_bytes == 132


@pytest.mark.parametrize("width,tail", [(512, 64), (128, 0), (40, 8)])
def test_records_round_trip(width, tail):
    fmt = LatentRecords(width, tail)
    values = torch.randn(3, 7, width) * torch.logspace(-3, 3, 7)[None, :, None]
    rope = torch.randn(3, 7, tail) if tail else None
    records = fmt.pack(values, rope)
    assert records.dtype == torch.uint8 and records.shape == (3, 7, fmt.record_bytes)
    got, got_tail = fmt.unpack(records, torch.float32)
    padded = torch.nn.functional.pad(values.abs(), (0, -width % 128)).unflatten(-1, (-1, 128))
    block_max = padded.amax(-1).repeat_interleave(128, -1)[..., :width]
    bound = FP8_REL * values.abs() + FP8_FLOOR * block_max
    assert ((got - values).abs() <= bound).all()
    if tail:
        assert torch.equal(got_tail, rope.to(torch.bfloat16).float())


def test_zero_block_is_exact():
    codes, scales = quantize_blocks(torch.zeros(2, 256))
    assert torch.equal(dequantize_blocks(codes, scales, torch.float32), torch.zeros(2, 256))


def test_weight_tiles_round_trip_and_size():
    w = torch.randn(300, 200)
    codes, scales = quantize_weight(w)
    assert codes.dtype == torch.float8_e4m3fn and scales.shape == (3, 2)
    assert codes.numel() + scales.numel() * 4 == fp8_weight_bytes(300, 200)
    back = dequantize_weight(codes, scales, torch.float32)
    assert ((back - w).abs() <= FP8_REL * w.abs() + FP8_FLOOR * w.abs().max()).all()
    with pytest.raises(ValueError, match="scales of shape"):
        dequantize_weight(codes, scales[:1], torch.float32)


@pytest.mark.parametrize("shape, block", [((256, 384), (128, 128)), ((200, 72), (128, 128)), ((64, 96), (32, 16))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_weight_upcasts_to_the_per_value_products(shape, block, dtype):
    """Whole tiles take a broadcast, ragged ones a per-value scale: both are codes * scale in fp32."""
    from quant.fp8 import Fp8Weight

    codes, scales = quantize_weight(torch.randn(shape, generator=torch.Generator().manual_seed(3)), block)
    per_value = scales.repeat_interleave(block[0], 0)[:shape[0]].repeat_interleave(block[1], 1)[:, :shape[1]]
    expected = (codes.float() * per_value).to(dtype)
    w = Fp8Weight(codes, scales, block, dtype)
    assert torch.equal(w.dequantize(), expected)
    assert w.nbytes == fp8_weight_bytes(*shape, block)
    parts = w.to_tensors("x::")
    assert parts["x::fp8.codes"].dtype == torch.uint8  # the disk tier stores bytes
    back = Fp8Weight.from_tensors(parts, "x::")
    assert (back.block, back.dtype) == (block, dtype) and torch.equal(back.dequantize(), expected)


def test_fp8_weight_refuses_mismatched_scales():
    from quant.fp8 import Fp8Weight

    codes, scales = quantize_weight(torch.randn(256, 128))
    with pytest.raises(ValueError, match=r"needs scales of shape \(2, 1\), got \(1, 1\)"):
        Fp8Weight(codes, scales[:1], (128, 128), torch.float32)


def test_fp8_values_are_torchs_for_every_finite_code():
    from quant.fp8 import fp8_values, has_nan_codes

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = torch.ones(256, dtype=torch.bool)
    finite[[0x7F, 0xFF]] = False  # e4m3fn's two NaNs
    assert torch.equal(fp8_values(codes)[finite], codes.float()[finite])
    assert has_nan_codes(codes) and not has_nan_codes(codes[finite])


@pytest.mark.parametrize("scale", [1e-30, 3e-3, 1.0, 127.0, 2.0 ** 7, 1e20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_upcast_folds_the_bit_trick_into_the_scales_without_changing_a_bit(scale, dtype):
    """Every finite code times a scale below 2^7 (the 2^120 of the bit trick folded into it) and
    at or above it (not folded: it would overflow) is code * scale in fp32, then `dtype`."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].repeat(2)[:2 * 127].repeat(128, 1).view(torch.float8_e4m3fn)
    scales = torch.full((1, 2), scale)
    expected = (codes.float() * scale).to(dtype)
    assert torch.equal(dequantize_weight(codes, scales, dtype), expected)
    out = torch.empty(codes.shape, dtype=dtype)  # into a caller's buffer, as `models.linear` upcasts
    assert dequantize_weight(codes, scales, dtype, out=out) is out and torch.equal(out, expected)
