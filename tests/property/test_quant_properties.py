"""Property tests (hypothesis) for group-wise quantization: error bound, packed size, exactness."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quant import QuantConfig, dequantize, quantize
from quant.pack import pack_nibbles, unpack_nibbles
from quant.groupwise import dense_params
from quant.qtensor import GroupLayout, dtype_name

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 37), min_size=ndim, max_size=ndim)))
    config = QuantConfig(
        bits=draw(st.sampled_from([4, 8])),
        group_size=draw(st.sampled_from([1, 2, 5, 16, 64])),
        group_dim=draw(st.integers(-ndim, ndim - 1)),
        symmetric=draw(st.booleans()),
        param_bits=draw(st.sampled_from([16, 8])),
    )
    dtype = draw(st.sampled_from(DTYPES))
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0]))
    offset = draw(st.sampled_from([0.0, 5.0, -1000.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * scale + offset).to(dtype)
    return x, config


def per_element(qt, per_group: torch.Tensor) -> torch.Tensor:
    """A `[outer, groups or 1, 1, inner]` tensor broadcast back to `qt.shape` (float32)."""
    lay = GroupLayout.of(qt.shape, qt.config)
    values = per_group.float().expand(lay.outer, lay.num_groups, lay.group_size, lay.inner)
    values = values.reshape(lay.outer, lay.padded_length, lay.inner)[:, : lay.length, :]
    return values.reshape(qt.shape)


def step_per_element(qt) -> torch.Tensor:
    """Each element's group step (as dequantize uses it), in the original shape."""
    return per_element(qt, dense_params(qt.scales))


def param_slack(qt) -> torch.Tensor:
    """Extra error 8-bit params allow: the decoded min may sit above the group's min, and
    the decoded step may fall short of covering its max (half a param step each)."""
    if qt.config.param_bits == 16:
        return torch.zeros(qt.shape)
    slack = 0.5 * qt.config.max_code * per_element(qt, qt.scales.scales)
    if qt.mins is not None:
        slack += 0.5 * per_element(qt, qt.mins.scales)
    return slack


@settings(max_examples=80, deadline=None)
@given(cases())
def test_every_error_is_at_most_half_a_step(case):
    x, config = case
    qt = quantize(x, config)
    y = dequantize(qt)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    err = (y.float() - x.float()).abs()
    eps = torch.finfo(x.dtype).eps
    # half a step, plus float rounding: the dtype's epsilon on the magnitudes involved
    step = step_per_element(qt)
    bound = 0.5 * step + param_slack(qt) + eps * (x.float().abs() + qt.config.max_code * step) + 1e-30
    worst = (err - bound).max().item()
    assert worst <= 0, f"error exceeds half a step by {worst}"


@settings(max_examples=50, deadline=None)
@given(cases())
def test_packed_size_is_half_the_codes_plus_group_params(case):
    x, config = case
    qt = quantize(x, config)
    n = x.numel()
    assert qt.codes.dtype == torch.uint8
    assert qt.codes.numel() == (math.ceil(n / 2) if config.bits == 4 else n)
    assert dense_params(qt.scales).numel() == config.num_groups(tuple(x.shape))
    params = 1 if config.symmetric else 2
    if config.param_bits == 16:
        expected = qt.codes.numel() + params * qt.scales.numel() * x.element_size()
    else:  # one byte per group param + a (step, min) pair per position the groups share
        positions = qt.scales.scales.numel()
        expected = qt.codes.numel() + params * (qt.scales.numel + 2 * positions * x.element_size())
    assert qt.nbytes == expected == config.packed_nbytes(tuple(x.shape), dtype_name(x.dtype))


@settings(max_examples=50, deadline=None)
@given(cases(), st.floats(-6e4, 6e4, allow_nan=False, allow_subnormal=False))
def test_constant_tensor_round_trips_exactly(case, value):
    x, config = case
    config = QuantConfig(
        bits=config.bits, group_size=config.group_size, group_dim=config.group_dim, param_bits=config.param_bits
    )
    const = torch.full(x.shape, value, dtype=x.dtype)
    assert torch.equal(dequantize(quantize(const, config)), const)


@settings(max_examples=30, deadline=None)
@given(cases(), st.floats(-100, 100, allow_nan=False))
def test_symmetric_constant_is_finite_and_close(case, value):
    x, config = case
    config = QuantConfig(bits=config.bits, group_size=config.group_size, group_dim=config.group_dim, symmetric=True)
    const = torch.full(x.shape, value, dtype=x.dtype)
    y = dequantize(quantize(const, config)).float()
    assert torch.isfinite(y).all()
    assert (y - const.float()).abs().max() <= abs(value) * 0.08 + 1e-6


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=0, max_size=99))
def test_nibble_pack_round_trip(values):
    codes = torch.tensor(values, dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.numel() == math.ceil(len(values) / 2)
    assert torch.equal(unpack_nibbles(packed, len(values)), codes)


def test_groups_really_differ_per_group():
    # One wide group next to a narrow one: the narrow group must keep its own fine step.
    x = torch.cat([torch.linspace(-100, 100, 64), torch.linspace(0, 1, 64)]).reshape(2, 64)
    qt = quantize(x, QuantConfig(group_dim=1))
    err = (dequantize(qt) - x).abs()
    assert err[1].max() <= 0.5 / 15 + 1e-6
    assert err[0].max() > 0.1  # the wide group is coarse: proves steps are per group


def test_group_dim_zero_groups_output_channels():
    # Grouping along dim 0: scales are [1, out/64, 1, in], one per (64 rows, column).
    qt = quantize(torch.randn(128, 10), QuantConfig(group_dim=0))
    assert tuple(qt.scales.shape) == (1, 2, 1, 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_into_out_and_other_dtype(dtype):
    x = torch.randn(70, 33).to(dtype)
    qt = quantize(x, QuantConfig(group_dim=0))
    ref = dequantize(qt)
    out32 = torch.empty(70, 33)
    assert dequantize(qt, out=out32) is out32
    torch.testing.assert_close(out32.to(dtype), ref, rtol=0, atol=0)
    out16 = torch.empty(70, 33, dtype=torch.float16)
    assert torch.equal(dequantize(qt, out=out16), dequantize(qt, dtype=torch.float16))
    assert torch.equal(dequantize(qt, dtype=torch.float32).to(dtype), ref)
    with pytest.raises(ValueError, match="shape"):
        dequantize(qt, out=torch.empty(3, 3))


def test_rejects_integer_input_with_clear_message():
    with pytest.raises(ValueError, match="float16"):
        quantize(torch.arange(10), QuantConfig())


def test_scalar_and_empty_tensors():
    s = torch.tensor(3.25)
    assert torch.equal(dequantize(quantize(s, QuantConfig())), s)
    empty = torch.empty(0, 8)
    assert dequantize(quantize(empty, QuantConfig())).shape == (0, 8)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape, group_dim", [((64, 7), 0), ((3, 5, 16), -1), ((9, 64), 1)])
def test_chunked_cpu_path_matches_single_chunk(monkeypatch, bits, shape, group_dim):
    import quant.groupwise as groupwise

    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).half()
    qt = quantize(x, QuantConfig(bits=bits, group_size=16 if group_dim == -1 else 64, group_dim=group_dim))
    whole = dequantize(qt)
    monkeypatch.setattr(groupwise, "_CHUNK_ELEMENTS", 48)  # many chunks, one straddling the split
    assert torch.equal(dequantize(qt), whole)
    assert torch.equal(dequantize(qt, out=torch.empty(shape)).half(), whole)


def test_eight_bit_params_keep_gguf_q4_1_blocks_nearly_exact():
    # Values on a Q4_1-like grid (16 levels per 32 inputs along dim 1): group 32 along dim 1
    # re-represents them almost exactly, even with 8-bit params, at 4.5 bits per element.
    gen = torch.Generator().manual_seed(0)
    step = torch.rand(32, 18, 1, generator=gen) * 0.01 + 0.001
    low = torch.randn(32, 18, 1, generator=gen) * 0.05
    levels = torch.randint(0, 16, (32, 18, 32), generator=gen)
    levels[..., 0], levels[..., 1] = 0, 15  # every block spans its full range, as Q4_1's do
    w = (low + step * levels).reshape(32, 576).half()  # rows as wide as SmolLM2's hidden size
    for config, max_rel in [
        (QuantConfig(group_size=32, group_dim=1, param_bits=8), 0.01),
        (QuantConfig(group_size=64, group_dim=0), 0.05),
    ]:
        qt = quantize(w, config)
        rel = ((dequantize(qt).float() - w.float()).norm() / w.float().norm()).item()
        assert (rel < max_rel) == (config.group_dim == 1)
    assert quantize(w, QuantConfig(group_size=32, group_dim=1, param_bits=8)).nbytes / (w.numel() * 2) < 0.30
