"""Weight quantizers behind one interface: `get_weight_quantizer(name)`.

Names: `groupwise4`, `groupwise8` (ours, `quant.groupwise`), `nf4`, `fp4`
(bitsandbytes' 4-bit data types, block-wise absmax), `none` (dense). Each quantizer has
`quantize(w) -> compressed` (with `.nbytes`, `.to(device)`, `.dequantize(...)`) and
`dequantize(compressed, dtype=None, device=None) -> Tensor`. bitsandbytes runs on CUDA
and, from 0.46 on, on CPU; where it cannot run, `QuantBackendUnavailable` says why and what
to install. Imports torch; bitsandbytes only when nf4/fp4 is asked for.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Protocol

import torch

from quant.config import QuantConfig
from quant.groupwise import dequantize as groupwise_dequantize
from quant.groupwise import quantize as groupwise_quantize

WEIGHT_QUANTIZERS = ("groupwise4", "groupwise8", "nf4", "fp4", "none")
BNB_REQUIREMENT = "bitsandbytes>=0.46"


class QuantBackendUnavailable(RuntimeError):
    """The requested weight quantizer cannot run on this machine (the message says why)."""


class WeightQuantizer(Protocol):
    name: str

    def quantize(self, weight: torch.Tensor) -> object: ...

    def dequantize(self, compressed, dtype: torch.dtype | None = None, device=None) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class GroupwiseQuantizer:
    """FlexGen-style group-wise min-max quantization (`quant.groupwise`)."""

    config: QuantConfig

    @property
    def name(self) -> str:
        return f"groupwise{self.config.bits}"

    def quantize(self, weight: torch.Tensor):
        return groupwise_quantize(weight, self.config)

    def dequantize(self, compressed, dtype=None, device=None) -> torch.Tensor:
        return groupwise_dequantize(compressed, dtype=dtype, device=device)


@dataclasses.dataclass(frozen=True)
class DenseQuantizer:
    """`none`: weights stay as they are."""

    name: str = "none"

    def quantize(self, weight: torch.Tensor) -> torch.Tensor:
        return weight

    def dequantize(self, compressed: torch.Tensor, dtype=None, device=None) -> torch.Tensor:
        return compressed.to(device=device, dtype=dtype or compressed.dtype)


@dataclasses.dataclass(frozen=True)
class BnbTensor:
    """A bitsandbytes 4-bit weight: packed codes + its QuantState (absmax per block)."""

    codes: torch.Tensor
    state: object  # bitsandbytes.functional.QuantState
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        absmax = self.state.absmax
        return self.codes.numel() * self.codes.element_size() + absmax.numel() * absmax.element_size()

    def to(self, device, non_blocking: bool = False) -> "BnbTensor":
        state = copy.copy(self.state)  # QuantState.to moves in place; keep the original where it is
        state.to(device)
        return dataclasses.replace(self, codes=self.codes.to(device, non_blocking=non_blocking), state=state)

    def dequantize(self, dtype=None, device=None) -> torch.Tensor:
        moved = self if device is None or torch.device(device) == self.device else self.to(device)
        import bitsandbytes.functional as bnb_functional

        dense = bnb_functional.dequantize_4bit(moved.codes, moved.state).reshape(self.shape)
        return dense if dtype is None or dense.dtype == dtype else dense.to(dtype)


class BnbQuantizer:
    """bitsandbytes NF4/FP4 with block size 64 (absmax in fp32: 4.5 bits/element, like ours).

    Raises:
        QuantBackendUnavailable: bitsandbytes is missing or cannot quantize on `device`.
    """

    def __init__(self, quant_type: str, blocksize: int = 64, device: torch.device | str = "cpu") -> None:
        if quant_type not in ("nf4", "fp4"):
            raise ValueError(f"quant_type {quant_type!r} is not a bitsandbytes 4-bit type; use 'nf4' or 'fp4'")
        self.name = quant_type
        self.blocksize = blocksize
        self._functional = _load_bitsandbytes(quant_type, torch.device(device))

    def quantize(self, weight: torch.Tensor) -> BnbTensor:
        # NOTE: bitsandbytes 0.50's CPU dequantize kernel restarts its blocks at every row,
        # while quantize blocks the flat tensor, so a last dim that is not a multiple of
        # the block size came back wrong (mean error 0.22 vs 0.09 of |w| on a 128x96
        # weight). Quantizing rows of exactly one block (or one flat row) makes both agree.
        flat = weight.contiguous().reshape(-1)
        if flat.numel() % self.blocksize == 0:
            flat = flat.view(-1, self.blocksize)
        codes, state = self._functional.quantize_4bit(
            flat, blocksize=self.blocksize, quant_type=self.name, compress_statistics=False
        )
        return BnbTensor(codes=codes, state=state, shape=tuple(weight.shape), dtype=weight.dtype)

    def dequantize(self, compressed: BnbTensor, dtype=None, device=None) -> torch.Tensor:
        return compressed.dequantize(dtype=dtype, device=device)


def _load_bitsandbytes(quant_type: str, device: torch.device):
    """bitsandbytes.functional, after checking it really quantizes on `device`."""
    # bitsandbytes' CPU backend logs a warning at import about an optional gemm kernel
    # package; it does not affect quantize/dequantize, so keep it out of users' logs.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        import bitsandbytes.functional as bnb_functional
    except Exception as exc:  # ImportError, or a broken native library raising at import
        raise QuantBackendUnavailable(
            f"--weight-quant {quant_type} needs bitsandbytes, which could not be imported ({exc}); "
            f"install it with `pip install '{BNB_REQUIREMENT}'` (or `pip install 'flexlamps[bnb]'`), "
            "or use --weight-quant groupwise4"
        ) from exc
    try:  # a tiny round trip: old releases import fine on CPU but have no CPU kernels
        probe = torch.linspace(-1, 1, 128, device=device).reshape(2, 64)
        codes, state = bnb_functional.quantize_4bit(probe, blocksize=64, quant_type=quant_type)
        bnb_functional.dequantize_4bit(codes, state)
    except Exception as exc:
        import bitsandbytes

        raise QuantBackendUnavailable(
            f"bitsandbytes {getattr(bitsandbytes, '__version__', '?')} cannot run {quant_type} on {device} "
            f"({type(exc).__name__}: {exc}); CPU support needs `pip install -U '{BNB_REQUIREMENT}'`, "
            "otherwise use a CUDA device or --weight-quant groupwise4"
        ) from exc
    return bnb_functional


def get_weight_quantizer(
    name: str,
    group_size: int = 64,
    device: torch.device | str = "cpu",
    group_dim: int = 0,
    param_bits: int = 16,
) -> GroupwiseQuantizer | BnbQuantizer | DenseQuantizer:
    """The weight quantizer called `name` (one of `WEIGHT_QUANTIZERS`).

    Args:
        name: groupwise4 | groupwise8 | nf4 | fp4 | none.
        group_size: elements per group (ours) or per absmax block (bitsandbytes).
        device: where quantization will run; bitsandbytes is checked there.
        group_dim: groupwise only: 0 (output channels, FlexGen) or 1 (input channels;
            use it with group_size 32 on GGUF Q4_0/Q4_1 weights, whose blocks it matches).
        param_bits: groupwise only: 16, or 8 to store group scales/mins in 8 bits.
    Raises:
        ValueError: unknown name.
        QuantBackendUnavailable: nf4/fp4 when bitsandbytes cannot run on `device`.
    """
    if name == "none":
        return DenseQuantizer()
    if name in ("groupwise4", "groupwise8"):
        config = QuantConfig(bits=int(name[-1]), group_size=group_size, group_dim=group_dim, param_bits=param_bits)
        return GroupwiseQuantizer(config)
    if name in ("nf4", "fp4"):
        return BnbQuantizer(name, blocksize=group_size, device=device)
    raise ValueError(f"unknown weight quantizer {name!r}; choose one of {', '.join(WEIGHT_QUANTIZERS)}")
