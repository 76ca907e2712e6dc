"""Decode's products on plain 16-bit weights (flexlamps/kernels/half_gemv.c), in every variant this
CPU has: x @ w.T within an fp32 sum's rounding of the exact product, a row's bits its own (alone,
among others, on 1 or 2 threads), and the fused SwiGLU expert with the roundings of torch's ops,
which MoE decode runs on the CPU (`models.blocks.moe`)."""

import pytest
import torch
import torch.nn.functional as F

from flexlamps.kernels import half_gemv as hg
from flexlamps.models.blocks import dense_gemm, moe
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.weight_kind import Phase
from flexlamps.models.moe_config import MoEConfig
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel


@pytest.fixture(params=levels(hg.KERNEL))
def kernel(request) -> hg.HalfGemv:
    return variant_kernel(hg.KERNEL, request.param)


def _step(dtype) -> float:
    return 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(13, 37), (64, 256), (9, 8)])
def test_matmul_is_the_product_rounded_once_and_a_row_keeps_its_bits(kernel, dtype, shape):
    g = torch.Generator().manual_seed(shape[1])
    w = torch.randn(shape, generator=g).to(dtype)
    x = torch.randn(7, shape[1], generator=g).to(dtype)
    b = torch.randn(shape[0], generator=g).to(dtype)
    exact = x.double() @ w.double().T
    got = kernel.matmul(x, w)
    assert got.dtype == dtype and got.shape == (7, shape[0])
    with_bias = exact + b.double()  # added to the fp32 sum, one rounding
    assert ((kernel.matmul(x, w, b).double() - with_bias).abs()
            <= _step(dtype) * with_bias.abs() + shape[1] * 2.0 ** -23 * (x.double().abs() @ w.double().abs().T)).all()
    # one rounding to the dtype, plus an fp32 sum's reordering (k * 2^-24 of the sum of |terms|)
    bound = _step(dtype) * exact.abs() + shape[1] * 2.0 ** -23 * (x.double().abs() @ w.double().abs().T)
    assert ((got.double() - exact).abs() <= bound).all()
    assert_rows_alone_as_together(lambda w_, x_: kernel.matmul(x_, w_), [w], x)


def _expert(dtype, hidden=40, inter=21, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate, up = (torch.randn(inter, hidden, generator=g) / hidden ** 0.5).to(dtype), \
        (torch.randn(inter, hidden, generator=g) / hidden ** 0.5).to(dtype)
    down = (torch.randn(hidden, inter, generator=g) / inter ** 0.5).to(dtype)
    return gate, up, down


def assert_expert_adds_what_torchs_ops_add(kernel, dtype, num_tokens: int, picks: list[int]) -> None:
    """`kernel.expert_swiglu` on `picks` (flat token * 2 + slot) of `num_tokens` tokens adds what torch's
    ops add (within a rounding step or two: each product one fp32 sum in another order), leaves the
    other tokens alone, and gives a token alone the bits it gets among the others."""
    gate, up, down = _expert(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(num_tokens, 40, generator=g).to(dtype)
    weights = torch.rand(2 * num_tokens, generator=g)
    start = torch.randn(num_tokens, 40, generator=g).to(dtype)  # what earlier experts added
    out = start.clone()
    kernel.expert_swiglu(x, gate, up, down, torch.tensor(picks), 2, weights, out)
    tokens = torch.tensor(picks) // 2
    y = moe.swiglu(x[tokens], gate, up, down, F.linear)
    want = start.clone().index_add_(0, tokens, (y * weights[picks, None]).to(dtype))
    untouched = torch.ones(num_tokens, dtype=torch.bool).index_fill_(0, tokens, False)
    assert torch.equal(out[untouched], start[untouched])
    assert torch.allclose(out.float(), want.float(), rtol=4 * _step(dtype), atol=4 * _step(dtype))
    for p in picks:
        alone = start.clone()
        kernel.expert_swiglu(x, gate, up, down, torch.tensor([p]), 2, weights, alone)
        assert torch.equal(alone[p // 2], out[p // 2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_fused_expert_adds_what_torchs_ops_add_and_a_token_keeps_its_bits(kernel, dtype):
    assert_expert_adds_what_torchs_ops_add(kernel, dtype, 6, [1, 2, 7, 10])  # tokens 0, 1, 3, 5


def test_an_expert_of_many_picks_converts_its_weights_once_and_a_token_keeps_its_bits(kernel):
    """More than WIDEN_ROWS (6) picks: each weight row converted to fp32 once for all of them, the
    bits a token gets alone (16-bit loads)."""
    assert_expert_adds_what_torchs_ops_add(kernel, torch.bfloat16, 9, [1, 2, 7, 10, 12, 14, 17])


def test_moe_decode_runs_the_fused_experts_a_token_alone_as_in_a_batch(monkeypatch):
    """The MoE FFN's decode on bf16 experts takes the kernel (fp32 keeps torch's GEMMs; prompts,
    test_half_gemm.py):
    within a rounding or two of torch's ops, and a token's bits do not depend on its neighbours."""
    cfg = TINY_MOE
    x = torch.randn(5, 1, 40, generator=torch.Generator().manual_seed(2)).bfloat16()
    if moe._fused_experts(x, cfg, Phase.DECODE) is None:
        pytest.skip("the 16-bit decode kernel does not load here")
    assert moe._fused_experts(x, cfg, Phase.PROMPT) is not moe.decode_expert_kernel()
    assert moe._fused_experts(x.float(), cfg, Phase.DECODE) is None
    assert_moe_rows_alone_as_together_near_torch(cfg, x, monkeypatch)


TINY_MOE = MoEConfig(num_experts=4, num_experts_per_token=2, num_shared_experts=0, moe_intermediate_size=21,
                     moe_layers=(True,), router="softmax_topk")


def assert_moe_rows_alone_as_together_near_torch(cfg: MoEConfig, x: torch.Tensor, monkeypatch) -> None:
    """The MoE FFN of `cfg` (4 experts of 21 on 40 in bf16) on x (rows, tokens, 40): each row alone gets
    its bits among the others, and all are within a rounding or two of torch's ops (no kernel)."""
    w = {"router": torch.randn(4, 40, generator=torch.Generator().manual_seed(3)).bfloat16()}
    for e in range(4):
        w.update(zip((f"experts.{e}.gate_proj", f"experts.{e}.up_proj", f"experts.{e}.down_proj"),
                     _expert(torch.bfloat16, seed=e)))
    together = moe.moe_ffn(w, x, cfg)
    for i in range(len(x)):
        assert torch.equal(moe.moe_ffn(w, x[i:i + 1], cfg), together[i:i + 1])
    monkeypatch.setattr(moe, "_fused_experts", lambda *args: None)
    assert torch.allclose(together.float(), moe.moe_ffn(w, x, cfg).float(), rtol=2 ** -6, atol=2 ** -6)


def test_dense_decode_rows_in_16_bits_take_the_kernel_where_torchs_gemm_is_slow():
    """The dense kind's decode product on an AVX2 CPU (no oneDNN bf16) is the kernel's, bias
    included; prompts take theirs (test_half_gemm.py)."""
    kernel = moe.decode_expert_kernel()
    x, w = torch.randn(3, 1, 64).bfloat16(), torch.randn(24, 64).bfloat16()
    b = torch.randn(24).bfloat16()
    if kernel is None or torch.bfloat16 not in dense_gemm._HALF_DECODE_DTYPES:
        assert dense_gemm.half_product(x, w) is None
        pytest.skip("torch's 16-bit GEMM is fast here, or the kernel does not load")
    assert torch.equal(linear(x, w, b), kernel.matmul(x, w, b))
