"""`silu(x)`: SiLU whose result for a row does not depend on the other rows of the tensor.

torch's CPU `F.silu` runs most elements through a vectorized exp and the last few of the whole
tensor (less than a vector's worth) through the scalar one, which rounds differently; in fp32 a
row's result then depends on how many rows share the call (a decode batch, a prompt chunk).
`torch.exp` is vectorized to the last element, so x / (1 + exp(-x)) built on it is not. In bf16
torch computes both paths in fp32 and rounds once, which agrees; `F.silu` is kept there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return F.silu(x, inplace=inplace)
    denominator = x.neg().exp_().add_(1)
    return x.div_(denominator) if inplace else x / denominator
