"""ChannelQuantizedKVBuffer: keys grouped per channel along the sequence, residual kept dense."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quant import KEY_CACHE_PER_CHANNEL, ChannelQuantizedKVBuffer, QuantConfig, dequantize, quantize


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.sampled_from([4, 8]), st.booleans())
def test_appends_match_block_quantization_and_residual_is_exact(chunks, bits, symmetric):
    config = QuantConfig(bits=bits, group_size=16, group_dim=2, symmetric=symmetric)
    total = sum(chunks)
    keys = torch.randn(2, 3, total, 8, generator=torch.Generator().manual_seed(total)).half()
    buf = ChannelQuantizedKVBuffer(2, 3, total, 8, config)
    start = 0
    for size in chunks:
        buf.append(keys[:, :, start : start + size])
        start += size
    full = total // 16 * 16
    out = buf.dequantize()
    assert out.shape == keys.shape
    assert torch.equal(out[:, :, :full], dequantize(quantize(keys[:, :, :full], config)))
    assert torch.equal(out[:, :, full:], keys[:, :, full:])  # the newest tokens are not yet compressed
    assert torch.equal(buf.dequantize(total // 2), out[:, :, : total // 2])


def test_outlier_channel_does_not_spoil_other_channels():
    # One key channel 100x larger: grouping per channel keeps the others fine.
    keys = torch.randn(1, 1, 64, 64, dtype=torch.float16)
    keys[..., 5] *= 100
    buf = ChannelQuantizedKVBuffer(1, 1, 64, 64)
    buf.append(keys)
    per_channel = (buf.dequantize() - keys).float().abs().amax(dim=2)[0, 0]
    head_dim = (dequantize(quantize(keys, QuantConfig(group_dim=-1))) - keys).float().abs().amax(dim=2)[0, 0]
    others = torch.arange(64) != 5
    assert per_channel[others].max() < head_dim[others].max() / 10


def test_truncate_into_a_compressed_block_then_append():
    keys = torch.randn(1, 2, 40, 8, dtype=torch.float16)
    buf = ChannelQuantizedKVBuffer(1, 2, 40, 8, QuantConfig(group_size=16, group_dim=2))
    buf.append(keys)
    before = buf.dequantize()
    buf.truncate(20)  # inside block 1 (tokens 16..31), which was compressed
    assert buf.length == 20 and torch.equal(buf.dequantize(), before[:, :, :20])
    buf.append(keys[:, :, 20:])
    assert buf.dequantize().shape == keys.shape
    assert torch.equal(buf.dequantize()[:, :, :16], before[:, :, :16])
    assert torch.equal(buf.to("cpu").dequantize(), buf.dequantize())


def test_size_and_errors():
    buf = ChannelQuantizedKVBuffer(1, 2, 1024, 64, KEY_CACHE_PER_CHANNEL)
    fp16_bytes = 2 * 1024 * 64 * 2
    assert buf.nbytes / fp16_bytes < 0.35  # 0.281 + the 64-token dense residual
    with pytest.raises(ValueError, match="capacity 1024"):
        buf.append(torch.zeros(1, 2, 1025, 64))
    with pytest.raises(ValueError, match="group_dim=-1"):
        ChannelQuantizedKVBuffer(1, 2, 8, 64, QuantConfig(group_dim=-1))
    with pytest.raises(ValueError, match="upto=1"):
        buf.dequantize(1)
