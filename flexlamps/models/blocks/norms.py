"""Norms: RMSNorm (its exact reference rounding, or the fused native kernel in 16-bit)."""

from __future__ import annotations

import torch

from flexlamps.kernels import loader


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # The reference normalizes in fp32, casts back, then scales; torch's fused kernel gives
    # the same bits in one pass (in fp32 with the scale folded in). In bf16/fp16 it normalizes in
    # fp32 and rounds to the input's dtype itself (no casts around it: two ops fewer a norm);
    # the scale is applied after that rounding, as the reference does.
    if x.dtype == torch.float32:
        return torch.rms_norm(x, x.shape[-1:], weight, eps)
    ops = native_ops()  # AVX-512: the same two roundings in one pass (flexlamps.kernels.elementwise)
    if (ops is not None and ops.takes(x) and weight.dtype == x.dtype and weight.is_contiguous()
            and weight.shape == x.shape[-1:] and weight.device == x.device):
        return ops.rms_norm(x, weight, eps)
    return weight * torch.rms_norm(x, x.shape[-1:], None, eps)


def native_ops():
    """This process's AVX-512 RMSNorm and SwiGLU (`flexlamps.kernels.elementwise`), or None where
    torch's ops run (`flexlamps.kernels.loader` says why)."""
    return loader.chosen().get("elementwise")


def rms_norm_plus_one(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: normalized in fp32 and scaled by (1 + w) in fp32, rounded once (transformers'
    Gemma2RMSNorm: `(x * (1 + w)).to(dtype)`, not LLaMA's rounding before the scale)."""
    return torch.rms_norm(x.float(), x.shape[-1:], 1.0 + weight.float(), eps).to(x.dtype)
