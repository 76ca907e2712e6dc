"""`silu(x)`, `gelu_tanh(x)`, `sigmoid(x)`, `softplus(x)`: activations whose result for a row does
not depend on the other rows.

torch's CPU `F.silu` runs most elements through a vectorized exp and the last few of the whole
tensor (less than a vector's worth) through the scalar one, which rounds differently; in fp32 a
row's result then depends on how many rows share the call (a decode batch, a prompt chunk).
`torch.exp` is vectorized to the last element, so x / (1 + exp(-x)) built on it is not. In bf16
torch computes both paths in fp32 and rounds once, which agrees; `F.silu` is kept there. `F.gelu`'s
tanh form splits the same way (2 of 7 rows of a (7, 37) fp32 tensor moved), so in fp32 it is
written out over `torch.tanh`, vectorized to the end (within 2e-7 of `F.gelu`). `torch.sigmoid` and
`F.softplus` split the same way (42 and 96 of 299 row counts of a (300, 24) fp32 tensor move a row), so
in fp32 they are written over `torch.exp` and `torch.log1p` (within 1.2e-7 of torch's, relative).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.silu(x, inplace=inplace)
    denominator = x.neg().exp_().add_(1)
    return x.div_(denominator) if inplace else x / denominator


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return torch.sigmoid(x)
    return 1 / x.neg().exp_().add_(1)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """F.softplus with its default beta 1 and threshold 20 (x itself above it)."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.softplus(x)
    return torch.where(x > 20, x, x.exp().log1p_())


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """GELU's tanh approximation (transformers' gelu_pytorch_tanh, Gemma's activation); `inplace`
    only for silu's signature (x is never written)."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.gelu(x, approximate="tanh")
    inner = x * x
    inner = inner.mul_(0.044715 * _GELU_C).add_(_GELU_C).mul_(x)  # c (x + 0.044715 x^3)
    return inner.tanh_().add_(1.0).mul_(x).mul_(0.5)


ACTIVATIONS = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh}
