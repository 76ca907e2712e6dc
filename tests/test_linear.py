"""The shared matmul: a row's result never depends on which rows share the call."""

import pytest
import torch
import torch.nn.functional as F

from flexlamps.models.linear import linear, uses_onednn

SHAPES = [(1536, 576), (576, 1536), (192, 576), (37, 19), (4096, 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_in", SHAPES)
def test_rows_are_independent_of_the_batch(dtype, out_in):
    gen = torch.Generator().manual_seed(0)
    n_out, n_in = out_in
    w = torch.randn(n_out, n_in, generator=gen).to(dtype)
    b = torch.randn(n_out, generator=gen).to(dtype)
    x = torch.randn(300, n_in, generator=gen).to(dtype)
    full = linear(x, w, b)
    for rows in (1, 2, 3, 8, 31, 32, 33, 129):
        assert torch.equal(linear(x[:rows], w, b), full[:rows]), rows
        assert torch.equal(linear(x[rows:rows + 1], w, b), full[rows:rows + 1]), rows
    # a (n, T, in) activation gives the same rows as the flattened one
    assert torch.equal(linear(x[:240].view(8, 30, n_in), w, b).view(240, n_out), full[:240])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_matches_torch_linear(dtype, tol):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(96, 80, generator=gen).to(dtype)
    x = torch.randn(5, 7, 80, generator=gen).to(dtype)
    ref = F.linear(x.float(), w.float())
    got = linear(x, w)
    assert got.shape == ref.shape and got.dtype == dtype
    assert ((got.float() - ref).abs().max() / ref.abs().max()).item() < tol


def test_fp16_and_grad_fall_back_to_torch():
    w = torch.randn(8, 4)
    assert not uses_onednn(torch.randn(2, 4, requires_grad=True), w)
    assert not uses_onednn(torch.randn(2, 4).half(), w.half())
    x = torch.randn(3, 4).half()
    assert torch.equal(linear(x, w.half()), F.linear(x, w.half()))
