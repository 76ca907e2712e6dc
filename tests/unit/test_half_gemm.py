"""Prompts' products on plain 16-bit weights (flexlamps/kernels/half_gemm.c): x @ w.T within an fp32
sum's rounding of the exact product, a row's bits its own (alone, among others, on 1 or 2 threads,
across the kernel's row chunks), and the SwiGLU expert with the roundings of torch's ops, which a
prompt's MoE experts and dense matrices run on where torch's 16-bit GEMM is slow (AVX2)."""

import pytest
import torch
import torch.nn.functional as F

from flexlamps.kernels import half_gemm as hm
from flexlamps.models.blocks import dense_gemm, moe
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.weight_kind import Phase
from flexlamps.models.moe_config import MoEConfig
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel
from tests.unit.test_half_gemv import _expert, _step


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
    gate, up, down = _expert(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 40, generator=g).to(dtype)
    weights = torch.rand(18, generator=g)  # 9 tokens, 2 slots
    start = torch.randn(9, 40, generator=g).to(dtype)  # what earlier experts added
    picks = torch.tensor([1, 2, 7, 10, 12, 14, 17])  # tokens 0, 1, 3, 5, 6, 7, 8
    out = start.clone()
    kernel.expert_swiglu(x, gate, up, down, picks, 2, weights, out)
    tokens = picks // 2
    y = moe.swiglu(x[tokens], gate, up, down, F.linear)
    want = start.clone().index_add_(0, tokens, (y * weights[picks, None]).to(dtype))
    untouched = torch.ones(9, dtype=torch.bool).index_fill_(0, tokens, False)
    assert torch.equal(out[untouched], start[untouched])
    assert torch.allclose(out.float(), want.float(), rtol=4 * _step(dtype), atol=4 * _step(dtype))
    for p in picks.tolist():  # a token's bits alone are its bits among the others
        alone = start.clone()
        kernel.expert_swiglu(x, gate, up, down, torch.tensor([p]), 2, weights, alone)
        assert torch.equal(alone[p // 2], out[p // 2])


def _moe(cfg: MoEConfig) -> dict:
    w = {"router": torch.randn(4, 40, generator=torch.Generator().manual_seed(3)).bfloat16()}
    for e in range(4):
        w.update(zip((f"experts.{e}.gate_proj", f"experts.{e}.up_proj", f"experts.{e}.down_proj"),
                     _expert(torch.bfloat16, seed=e)))
    return w


def test_a_prompts_experts_take_the_kernel_a_prompt_alone_as_in_a_batch(monkeypatch):
    """The MoE FFN on a prompt's bf16 tokens (an AVX2 CPU) runs each expert on all its tokens in one
    call: within a rounding or two of torch's ops, a prompt's bits not its neighbours'."""
    cfg = MoEConfig(num_experts=4, num_experts_per_token=2, num_shared_experts=0, moe_intermediate_size=21,
                    moe_layers=(True,), router="softmax_topk")
    x = torch.randn(3, 7, 40, generator=torch.Generator().manual_seed(2)).bfloat16()
    if moe._fused_experts(x, cfg, Phase.PROMPT) is None:
        pytest.skip("torch's 16-bit GEMM is fast here, or the prompt kernel does not load")
    assert isinstance(moe._fused_experts(x, cfg, Phase.PROMPT), hm.HalfGemm)
    w = _moe(cfg)
    together = moe.moe_ffn(w, x, cfg)
    for i in range(3):
        assert torch.equal(moe.moe_ffn(w, x[i:i + 1], cfg), together[i:i + 1])
    monkeypatch.setattr(moe, "_fused_experts", lambda *args: None)
    assert torch.allclose(together.float(), moe.moe_ffn(w, x, cfg).float(), rtol=2 ** -6, atol=2 ** -6)


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
