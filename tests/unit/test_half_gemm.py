"""Prompts' products on plain 16-bit weights (flexlamps/kernels/half_gemm.c): x @ w.T within an fp32
sum's rounding of the exact product, a row's bits its own (alone, among others, on 1 or 2 threads,
across the kernel's row chunks), and the SwiGLU expert with the roundings of torch's ops, which a
prompt's MoE experts and dense matrices run on where torch's 16-bit GEMM is slow (AVX2)."""

import pytest
import torch

from flexlamps.kernels import half_gemm as hm
from flexlamps.models.blocks import dense_gemm, moe
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.weight_kind import Phase
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel
from tests.unit.test_half_gemv import (TINY_MOE, _step, assert_expert_adds_what_torchs_ops_add,
                                       assert_moe_rows_alone_as_together_near_torch)


@pytest.fixture(params=levels(hm.KERNEL))
def kernel(request) -> hm.HalfGemm:
    return variant_kernel(hm.KERNEL, request.param)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(13, 37), (64, 256), (9, 8), (40, 5)])
def test_matmul_is_the_product_rounded_once_and_a_row_keeps_its_bits(kernel, dtype, shape):
    g = torch.Generator().manual_seed(shape[1])
    w = torch.randn(shape, generator=g).to(dtype)
    x = torch.randn(7, shape[1], generator=g).to(dtype)  # a whole tile of 4 rows and a short one
    b = torch.randn(shape[0], generator=g).to(dtype)
    exact = x.double() @ w.double().T
    slack = shape[1] * 2.0 ** -23 * (x.double().abs() @ w.double().abs().T)  # an fp32 chain's roundings
    got = kernel.matmul(x, w)
    assert got.dtype == dtype and got.shape == (7, shape[0])
    assert ((got.double() - exact).abs() <= _step(dtype) * exact.abs() + slack).all()
    with_bias = exact + b.double()  # added to the fp32 sum, one rounding
    assert ((kernel.matmul(x, w, b).double() - with_bias).abs() <= _step(dtype) * with_bias.abs() + slack).all()
    assert_rows_alone_as_together(lambda w_, x_: kernel.matmul(x_, w_), [w], x)


def test_a_row_keeps_its_bits_across_the_kernels_row_chunks(kernel):
    """More rows than one chunk (MC = 384) of the kernel: row 400 gets what it gets alone."""
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(20, 24, generator=g).bfloat16(), torch.randn(401, 24, generator=g).bfloat16()
    together = kernel.matmul(x, w)
    for i in (0, 383, 384, 400):
        assert torch.equal(kernel.matmul(x[i:i + 1], w), together[i:i + 1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_expert_adds_what_torchs_ops_add_and_a_token_keeps_its_bits(kernel, dtype):
    assert_expert_adds_what_torchs_ops_add(kernel, dtype, 9, [1, 2, 7, 10, 12, 14, 17])  # two tiles, one short


def test_a_prompts_experts_take_the_kernel_a_prompt_alone_as_in_a_batch(monkeypatch):
    """The MoE FFN on a prompt's bf16 tokens (an AVX2 CPU) runs each expert on all its tokens in one
    call: within a rounding or two of torch's ops, a prompt's bits not its neighbours'."""
    x = torch.randn(3, 7, 40, generator=torch.Generator().manual_seed(2)).bfloat16()
    if moe._fused_experts(x, TINY_MOE, Phase.PROMPT) is None:
        pytest.skip("torch's 16-bit GEMM is fast here, or the prompt kernel does not load")
    assert isinstance(moe._fused_experts(x, TINY_MOE, Phase.PROMPT), hm.HalfGemm)
    assert_moe_rows_alone_as_together_near_torch(TINY_MOE, x, monkeypatch)


def test_dense_prompt_rows_in_16_bits_take_the_kernel_where_torchs_gemm_is_slow():
    """The dense kind's prompt product on an AVX2 CPU (no oneDNN bf16) is the prompt kernel's, bias
    included; decode rows keep decode's kernel."""
    kernel = dense_gemm.loader.chosen().get("half_gemm")
    x, w, b = torch.randn(2, 5, 64).bfloat16(), torch.randn(24, 64).bfloat16(), torch.randn(24).bfloat16()
    if kernel is None or torch.bfloat16 not in dense_gemm._HALF_DECODE_DTYPES:
        assert dense_gemm.half_product(x, w, phase=Phase.PROMPT) is None
        pytest.skip("torch's 16-bit GEMM is fast here, or the kernel does not load")
    assert torch.equal(linear(x, w, b), kernel.matmul(x, w, b))
    decode = x[:, :1]
    assert torch.equal(linear(decode, w, b), dense_gemm.loader.chosen().get("half_gemv").matmul(decode, w, b))
