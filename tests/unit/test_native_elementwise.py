"""The RMSNorm and SwiGLU product (flexlamps/kernels/elementwise.c), in every variant this CPU has: torch's
results with torch's roundings (all but a rare element an fp32 sum puts across a rounding
boundary, by one step), rows independent of each other, and how the layers use them."""

import pytest
import torch
import torch.nn.functional as F

from flexlamps.kernels import elementwise as ne
from flexlamps.models.blocks.norms import native_ops, rms_norm
from tests.kernel_variants import levels, variant_kernel

LAYER_OPS = native_ops()  # what the layers run in this process


@pytest.fixture(params=levels(ne.KERNEL))
def ops(request) -> ne.NativeElementwise:
    return variant_kernel(ne.KERNEL, request.param)


def _one_step_apart(got, want, dtype, steps: int = 1):
    """Equal, or `steps` rounding steps of the dtype apart (relative)."""
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    return ((got.float() - want.float()).abs() <= steps * step * want.float().abs() + 1e-30).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1, 576), (5, 3, 70), (2, 16), (33, 4096)])
def test_rms_norm_is_torchs(ops, dtype, shape):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    weight = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    want = weight * torch.rms_norm(x, shape[-1:], None, 1e-5)
    got = ops.rms_norm(x, weight, 1e-5)
    assert got.shape == x.shape and got.dtype == dtype
    # a sum of squares in another order than torch's may put the normalized value one step across
    # its rounding, which the scale's own rounding can make two steps of the output
    assert _one_step_apart(got, want, dtype, steps=2)
    assert (got != want).sum() <= max(2, 0.002 * got.numel())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1, 3072), (4, 7, 70), (3, 2, 32)])
def test_silu_mul_is_torchs(ops, dtype, shape):
    g = torch.Generator().manual_seed(shape[-1])
    gate_up = (torch.randn(shape, generator=g) * 4).to(dtype)
    gate_up[0, 0, :4] = torch.tensor([-100.0, 100.0, 0.0, -87.0])  # silu's limits, its zero, a tiny value
    half = shape[-1] // 2
    want = F.silu(gate_up[..., :half]) * gate_up[..., half:]
    got = ops.silu_mul(gate_up)
    assert got.shape == want.shape and _one_step_apart(got, want, dtype)
    assert (got != want).sum() <= max(2, 0.002 * got.numel())


def test_rows_are_independent_and_strided_rows_are_read_in_place(ops):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3 * 96, generator=g).bfloat16()
    weight = torch.randn(96, generator=g).bfloat16()
    view = x[:, 96:192]  # rows strided by 288
    full = ops.rms_norm(view, weight, 1e-6)
    assert torch.equal(full, ops.rms_norm(view.contiguous(), weight, 1e-6))
    for r in (0, 17, 39):
        assert torch.equal(ops.rms_norm(view[r:r + 1], weight, 1e-6), full[r:r + 1])
        assert torch.equal(ops.silu_mul(x[r:r + 1]), ops.silu_mul(x)[r:r + 1])
    assert ops.rms_norm(view[:0], weight, 1e-6).shape == (0, 96)
    assert ops.silu_mul(x[:0]).shape == (0, 144)


@pytest.mark.parametrize("threads", [2, 3])
def test_rows_split_over_threads_give_one_threads_bits(ops, threads):
    """From 2^16 values the rows split over tile_gemv's claim pool (pool_hook.h): a row's bits are
    the same on any thread count, rows not a multiple of the chunks' too."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(37, 2 * 2048, generator=g) * 3).bfloat16()
    weight = (torch.rand(2 * 2048, generator=g) + 0.5).bfloat16()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = ops.rms_norm(x, weight, 1e-5), ops.silu_mul(x)
        torch.set_num_threads(threads)
        for _ in range(2):  # the pool's workers started, then still spinning
            got = ops.rms_norm(x, weight, 1e-5), ops.silu_mul(x)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(LAYER_OPS is None, reason="the layers run torch's ops here (no AVX2 CPU or no C compiler)")
def test_the_layers_use_them_in_bf16_and_not_in_fp32():
    ops = LAYER_OPS
    x = torch.randn(2, 3, 64).bfloat16()
    weight = torch.randn(64).bfloat16()
    assert torch.equal(rms_norm(x, weight, 1e-5), ops.rms_norm(x, weight, 1e-5))
    x32, w32 = x.float(), weight.float()  # fp32: torch's fused kernel, the exact reference
    assert torch.equal(rms_norm(x32, w32, 1e-5), torch.rms_norm(x32, (64,), w32, 1e-5))
    assert not ops.takes(x32) and not ops.takes(x.transpose(1, 2))


def test_the_source_ships_with_the_package():
    assert ne.SOURCE.is_file() and ne.SOURCE.name == "elementwise.c"
