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
