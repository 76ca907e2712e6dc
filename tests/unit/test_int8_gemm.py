"""The int8 GEMM (flexlamps/kernels/int8_gemm.c), in every variant this CPU has: its arithmetic as
stated (x in int8 per group of 64, the weight in int8 per output channel, exact int32 sums, one rounding), rows independent of the batch
and of the thread count, and how `models.linear` uses it (prefill-sized calls only, the same bits
for a twin and a plain weight, so both engines agree)."""

import pytest
import torch

from flexlamps.models.blocks import linear as L
from flexlamps.models.blocks.dense_gemm import fast_dense_gemm
from flexlamps.kernels import int8_gemm as G
from quant.int4_weight import Int4Weight
from tests.kernel_variants import levels, variant_kernel


@pytest.fixture(params=levels(G.KERNEL))
def gemm(request) -> G.Int8Gemm:
    """The kernel itself in each variant this CPU has (linear may prefer AMX's bf16 GEMM)."""
    return variant_kernel(G.KERNEL, request.param)

needs_linear_use = pytest.mark.skipif(
    L.int8_kernel() is None or not fast_dense_gemm(torch.empty(0, dtype=torch.bfloat16)),
    reason="linear does not use the int8 GEMM here (prompts run it where the bf16 dense GEMM is fast)")


def _one_step_apart(got, want, dtype, x=None, w=None):
    """One rounding step of the dtype apart, plus (given x and w) the fp32 summation's reordering
    error over the groups: groups * 2^-24 of the sum of the groups' magnitudes."""
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    slack = 1e-6 * want.float().abs().max()
    if x is not None:
        groups = x.shape[-1] // G.GROUP
        slack = slack + groups * 2.0 ** -23 * _group_magnitude(x, w)
    return ((got.float() - want.float()).abs() <= step * want.float().abs() + slack).all()


def _group_magnitude(x, w):
    """sum over groups of |x's group . w's group| (N per row), in the kernel's scales."""
    xg = x.float().view(x.shape[0], -1, G.GROUP)
    wd = w.packed.view(-1, w.shape[1] // 4, G.BLOCK, 4).permute(0, 2, 1, 3).reshape(-1, w.shape[1]).float() - 128
    wd = (wd * w.scale[:, None])[:w.shape[0]].view(w.shape[0], -1, G.GROUP)
    return torch.einsum("rgk,ngk->rng", xg, wd).abs().sum(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, n, k", [(1, 16, 64), (3, 17, 128), (5, 50, 192), (9, 48, 64), (70, 33, 256)])
def test_matches_the_stated_arithmetic(gemm, dtype, rows, n, k):
    """Partial row tiles (4 rows), partial column panels (48) and a partial last block (16)."""
    g = torch.Generator().manual_seed(rows * n + k)
    w = G.Int8Matrix.from_dense(torch.randn(n, k, generator=g))
    x = (torch.randn(rows, k, generator=g) * 4).to(dtype)
    got, want = gemm.matmul(x, w), G.reference(x, w)
    assert got.shape == (rows, n) and got.dtype == dtype
    assert _one_step_apart(got, want, dtype, x, w)


@pytest.mark.parametrize("rows, cols", [(100, 64), (700, 320)])  # one chunk of dequantize, several
def test_a_quantized_weight_packs_from_its_exact_values_in_chunks(gemm, rows, cols):
    w = Int4Weight.quantize(torch.randn(rows, cols), 32, torch.bfloat16)
    want = G.Int8Matrix.from_dense(w.dequantize(torch.float32))
    got = gemm.pack_weight(w)
    assert torch.equal(got.packed, want.packed) and torch.equal(got.scale, want.scale)
    assert torch.equal(gemm.pack(w.dequantize(torch.float32)).packed, want.packed)


def test_a_row_does_not_depend_on_the_batch_or_the_threads(gemm):
    g = torch.Generator().manual_seed(0)
    w = G.Int8Matrix.from_dense(torch.randn(400, 320, generator=g))  # threaded: over 2^22 products
    x = torch.randn(37, 320, generator=g).bfloat16()
    full = gemm.matmul(x, w)
    for row in (0, 3, 4, 36):
        assert torch.equal(gemm.matmul(x[row:row + 1], w)[0], full[row])
    assert torch.equal(gemm.matmul(x[5:18], w), full[5:18])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(gemm.matmul(x, w), full)
    finally:
        torch.set_num_threads(threads)


def test_zero_groups_rows_and_channels_give_zeros_not_nans(gemm):
    w_dense = torch.randn(20, 128)
    w_dense[3] = 0  # a channel of zeros: scale 0
    w = G.Int8Matrix.from_dense(w_dense)
    x = torch.randn(4, 128).bfloat16()
    x[1] = 0  # a row of zeros
    x[2, :64] = 0  # a group of zeros
    out = gemm.matmul(x, w)
    assert torch.isfinite(out.float()).all()
    assert (out[1] == 0).all() and (out[:, 3] == 0).all()
    assert _one_step_apart(out, G.reference(x, w), torch.bfloat16, x, w)


def test_nan_and_inf_give_nan_outputs_as_a_float_gemm_would(gemm):
    w_dense = torch.randn(20, 128)
    w_dense[2, 7] = float("nan")
    w_dense[5, 9] = float("inf")
    x = torch.randn(4, 128)
    x[1, 70] = float("nan")
    x[3, 3] = float("-inf")
    out = gemm.matmul(x.bfloat16(), gemm.pack(w_dense)).float()
    bad_rows, bad_cols = {1, 3}, {2, 5}
    for r in range(4):
        for c in range(20):
            assert out[r, c].isnan() == (r in bad_rows or c in bad_cols), (r, c)


def test_the_packed_weight_is_the_weight_rounded_per_channel():
    w = torch.randn(19, 64) * torch.linspace(0.1, 3, 19)[:, None]
    m = G.Int8Matrix.from_dense(w)
    assert m.shape == (19, 64) and m.scale.shape == (32,) and m.packed.numel() == 32 * 64
    codes = m.packed.view(2, 16, 16, 4).permute(0, 2, 1, 3).reshape(32, 64).int() - 128
    assert codes.abs().max() <= 127 and (codes[19:] == 0).all()
    back = codes[:19].float() * m.scale[:19, None]
    assert ((back - w).abs() <= m.scale[:19, None] / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="multiple of 64"):
        G.Int8Matrix.from_dense(torch.randn(4, 96))


@pytest.mark.parametrize("rows, cols", [(19, 64), (48, 320), (1, 128)])
def test_the_kernels_pack_equals_the_plain_statement(gemm, rows, cols):
    w = torch.randn(rows, cols) * torch.rand(rows, 1) * 3
    w[0] = 0  # a zero channel
    w[-1, 5] = 7.5 * w[-1].abs().max() / 127 * 127  # a row's max
    for dense in (w, w.bfloat16()):
        want, got = G.Int8Matrix.from_dense(dense), gemm.pack(dense)
        assert got.shape == want.shape and torch.equal(got.packed, want.packed) and torch.equal(got.scale, want.scale)


def test_shapes_that_do_not_fit_are_refused_before_the_kernel_reads(gemm):
    w = gemm.pack(torch.randn(32, 128))
    with pytest.raises(ValueError, match="does not fit"):
        gemm.matmul(torch.randn(3, 64).bfloat16(), w)
    with pytest.raises(ValueError, match="does not fit"):
        gemm.matmul(torch.randn(3, 128), w)  # fp32
    with pytest.raises(ValueError, match="do not fit"):
        gemm._pack_rows(w, 30, torch.randn(4, 128))


def test_what_the_kernel_takes():
    assert G.can_take(torch.zeros(3, 128, dtype=torch.bfloat16), (8, 128))
    assert not G.can_take(torch.zeros(3, 96, dtype=torch.bfloat16), (8, 96))  # not whole groups
    assert not G.can_take(torch.zeros(3, 128), (8, 128))  # fp32 keeps the exact dense path
    assert not G.can_take(torch.zeros(3, 128, dtype=torch.bfloat16), (8, 64))


def test_error_against_the_exact_product_stays_near_one_percent(gemm):
    """Gaussian x and weight: the rms error of int8 x (groups of 64) and int8 weight (per channel)."""
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(256, 576, generator=g), torch.randn(64, 576, generator=g)
    exact = x @ w.t()
    got = gemm.matmul(x.bfloat16(), G.Int8Matrix.from_dense(w)).float()
    assert (got - exact).norm() / exact.norm() < 0.015


@needs_linear_use
def test_linear_runs_it_for_prompts_with_the_same_bits_for_twin_and_plain(monkeypatch):
    from flexlamps.models.blocks import coded_weights

    # it serves the prompts our codes' product does not take (AVX-512's 5-bit form): here, none does
    monkeypatch.setattr(coded_weights, "native_kernel", lambda: None)
    gemm = L.int8_kernel()
    g = torch.Generator().manual_seed(5)
    w = Int4Weight.quantize(torch.randn(96, 192, generator=g), 32, torch.bfloat16)
    twin = L.Int4Twin(w)
    many = torch.randn(128, 192, generator=g).bfloat16()
    want = gemm.matmul(many, gemm.pack(w.dequantize(torch.float32)))
    prompt = L.Phase.PROMPT
    assert torch.equal(L.linear(many, w, phase=prompt), want)
    assert torch.equal(L.linear(many, twin, phase=prompt), want)
    assert torch.equal(L.linear(many[:3], twin, phase=prompt), want[:3])  # a prompt's rows, any count
    bias = torch.randn(96, generator=g).bfloat16()
    assert torch.equal(L.linear(many, twin, bias, phase=prompt), want + bias)
    assert not torch.equal(L.linear(many, twin, phase=L.Phase.DECODE), want)  # decode keeps 16-bit x
    assert torch.equal(L.linear(many.float(), w), L.linear(many.float(), w.dequantize(torch.float32)))  # fp32: exact
