"""QuantizedKVBuffer: token-by-token appends match compressing the whole cache at once."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quant import KV_CACHE_DEFAULT, QuantConfig, QuantizedKVBuffer, dequantize, quantize

CONFIGS = [
    KV_CACHE_DEFAULT,
    QuantConfig(bits=8, group_size=64, group_dim=-1),
    QuantConfig(bits=4, group_size=24, group_dim=-1, symmetric=True),  # 40 = 24 + a short group
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("capacity", [9, 12])  # odd capacity: the nibble planes are uneven
def test_appends_equal_whole_tensor_quantization(config, capacity):
    gen = torch.Generator().manual_seed(0)
    batch, heads, head_dim = 2, 3, 40 if config.group_size == 24 else 64
    kv = torch.randn(batch, heads, capacity, head_dim, generator=gen).half()
    buf = QuantizedKVBuffer(batch, heads, capacity, head_dim, config, dtype=torch.float16)
    buf.append(kv[:, :, :4])  # a prefill chunk
    for token in range(4, capacity):  # then decode steps, one token each
        buf.append(kv[:, :, token : token + 1])
    reference = dequantize(quantize(kv, config))
    assert buf.length == capacity
    assert torch.equal(buf.dequantize(), reference)
    for upto in (0, 1, capacity // 2, capacity // 2 + 1):
        assert torch.equal(buf.dequantize(upto), reference[:, :, :upto])


def test_error_bound_and_size():
    kv = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    buf = QuantizedKVBuffer(1, 2, 16, 64)
    buf.append(kv)
    qt = quantize(kv, KV_CACHE_DEFAULT)
    step = qt.scales.float().reshape(1, 2, 16, 1)
    assert ((buf.dequantize().float() - kv.float()).abs() <= step / 2 + 1e-3 * kv.float().abs()).all()
    # codes: 4 bits per element; scales + mins: 2 x fp16 per 64 elements
    assert buf.nbytes == 2 * 16 * 64 // 2 + 2 * 2 * 16 * 2


def test_overwrite_truncate_and_move():
    kv = torch.randn(1, 1, 6, 64, dtype=torch.float16)
    buf = QuantizedKVBuffer(1, 1, 6, 64)
    buf.append(kv)
    buf.truncate(2)
    buf.append(kv[:, :, 3:4] * 10)  # recompute after a discard: slot 2 now holds new data
    assert buf.length == 3
    expected = dequantize(quantize(torch.cat([kv[:, :, :2], kv[:, :, 3:4] * 10], 2), KV_CACHE_DEFAULT))
    assert torch.equal(buf.dequantize(), expected)
    moved = buf.to("cpu")
    assert moved.length == 3 and torch.equal(moved.dequantize(), expected)


def test_errors_name_the_problem():
    buf = QuantizedKVBuffer(1, 2, 4, 64)
    with pytest.raises(ValueError, match="capacity 4"):
        buf.append(torch.zeros(1, 2, 5, 64))
    with pytest.raises(ValueError, match=r"expected \[1, 2, num_new, 64\]"):
        buf.append(torch.zeros(1, 3, 1, 64))
    with pytest.raises(ValueError, match="upto=3"):
        buf.dequantize(3)
    with pytest.raises(ValueError, match="head_dim"):
        QuantizedKVBuffer(1, 2, 4, 64, QuantConfig(group_dim=2))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=8),
    st.sampled_from([4, 8]),
    st.integers(0, 3),
)
def test_any_split_of_appends_equals_whole_quantization(chunks, bits, spare):
    """However the tokens arrive (prefill chunks, single tokens), the stored cache is the same."""
    total = sum(chunks)
    capacity = total + spare  # spare slots move the nibble split point
    config = QuantConfig(bits=bits, group_size=32, group_dim=-1)
    kv = torch.randn(1, 2, total, 48, generator=torch.Generator().manual_seed(total)).to(torch.bfloat16)
    buf = QuantizedKVBuffer(1, 2, capacity, 48, config, dtype=torch.bfloat16)
    start = 0
    for size in chunks:
        buf.append(kv[:, :, start : start + size])
        start += size
    assert torch.equal(buf.dequantize(), dequantize(quantize(kv, config)))
