"""RMSNorm and SwiGLU's silu-times-up in bf16 / fp16 on AVX-512 CPUs (`elementwise.c`),
compiled on first use.

torch runs each as several ops: a decode row pays a few us of dispatch per op (SmolLM2's 61
norms a step: ~14 us each), and a prompt a pass over memory per op (32 x 128 tokens: 2-4 ms a
norm). Each kernel is one pass with fp32 arithmetic and torch's roundings (the normalized row
rounded to the dtype before the scale, as torch's `rms_norm` then `weight *`; silu rounded before
the product), so results equal torch's but where an fp32 sum or exp lands on the other side of a
rounding boundary. A row's result does not depend on the others.

`KERNEL` is how `flexlamps.kernels.loader` builds it and checks both ops against torch in each
dtype; the layers keep torch's ops (with a warning that says why where a build or check fails)
where the CPU lacks AVX-512 or no compiler is found. $FLEXLAMPS_NATIVE_KERNELS=0 turns it off.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.loader import require

SOURCE = build.SOURCES / "elementwise.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx512"))
DTYPES = {torch.bfloat16: 0, torch.float16: 1}


class NativeElementwise:
    """`rms_norm(x, weight, eps)` and `silu_mul(gate_up)` for CPU tensors in bf16 / fp16 whose
    last dim is contiguous (`takes`)."""

    def __init__(self, library: ctypes.CDLL, level: str = "avx512"):
        self.library, self.level = library, level
        self._norm, self._silu_mul = library.flexlamps_rms_norm, library.flexlamps_silu_mul
        self._norm.restype = self._silu_mul.restype = None
        self._norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]
        self._silu_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_int]

    @staticmethod
    def takes(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype in DTYPES and x.stride(-1) == 1 and x.dim() >= 2

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * round(x / sqrt(mean(x^2) + eps)) over the last dim (x in `takes`' form, its rows
        evenly strided; weight contiguous, of x's dtype)."""
        cols = x.shape[-1]
        rows = x.numel() // cols if cols else 0
        flat, stride = _rows(x, rows, cols)
        out = torch.empty(x.shape, dtype=x.dtype)
        if rows:
            self._norm(flat.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, cols, stride, eps, DTYPES[x.dtype],
                       torch.get_num_threads())
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """round(silu(gate)) * up for gate, up the two halves of the last dim of `gate_up`."""
        half = gate_up.shape[-1] // 2
        rows = gate_up.numel() // gate_up.shape[-1] if half else 0
        flat, stride = _rows(gate_up, rows, 2 * half)
        out = torch.empty(gate_up.shape[:-1] + (half,), dtype=gate_up.dtype)
        if rows:
            self._silu_mul(flat.data_ptr(), out.data_ptr(), rows, half, stride, DTYPES[gate_up.dtype],
                           torch.get_num_threads())
        return out


def _rows(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, int]:
    """x's rows (evenly strided, `takes`) and their stride: contiguous ones where they lie (a
    reshape costs about what a decode row's norm does), else a 2-d view."""
    if x.is_contiguous():
        return x, cols
    flat = x if x.dim() == 2 else x.reshape(rows, cols)
    return flat, flat.stride(0)


def _check(ops: NativeElementwise) -> None:
    """Both kernels against torch on odd widths (a partial last vector), within one rounding."""
    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        x = (torch.randn(3, 70, generator=gen) * 3).to(dtype)
        weight = torch.randn(70, generator=gen).to(dtype)
        want = weight * torch.rms_norm(x, (70,), None, 1e-5)
        got = ops.rms_norm(x, weight, 1e-5)
        require(bool(torch.allclose(got.float(), want.float(), rtol=2 ** -6, atol=1e-6)),
                f"native_elementwise: rms_norm's check failed in {dtype}")
        want = F.silu(x[:, :35]) * x[:, 35:]
        got = ops.silu_mul(x)
        require(bool(torch.allclose(got.float(), want.float(), rtol=2 ** -6, atol=1e-6)),
                f"native_elementwise: silu_mul's check failed in {dtype}")


KERNEL = loader.Kernel("elementwise", SOURCE, VARIANTS, "the RMSNorm and SwiGLU kernels", "they run as torch's ops",
                       NativeElementwise, _check)


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> NativeElementwise | None:
    """The kernels built into (or found in) `folder` and checked, or None where they cannot run
    here (the process's own: `loader.chosen().get("elementwise")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel
