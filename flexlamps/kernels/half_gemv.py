"""Decode's products on plain bf16 / fp16 weights (`half_gemv.c`), compiled on first use in an
AVX2 and an AVX-512 variant and loaded with ctypes.

torch's 16-bit GEMM on a CPU without oneDNN's bf16 (AVX2) multiplies a decode row at 1-5 GFLOP/s,
and a MoE expert on its few tokens runs as about ten dispatched ops (a gather, three products,
silu, a product, the routing weight, an index_add). Here:

- `matmul(x, w)`: x @ w.T rounded once to x's dtype, each output one fp32 dot product in a fixed
  order (one vector accumulator over the inner dimension, then its lanes summed);
- `expert_swiglu(...)`: one routed SwiGLU expert on its picks, added into the layer's output in
  place, with the roundings of torch's ops (`models.blocks.moe.swiglu` and the FFN's weighted add):
  one call an expert instead of ten ops.

A row's result depends on that row and the weight only: not on how many rows share the call, the
tile it lands in, or the thread count (`weight_kind`'s batch invariance). The sums run in
another order than torch's, so results equal torch's up to fp32 rounding of each dot product
(then one rounding to the dtype): `KERNEL`'s check holds them to that.

`KERNEL` is how `flexlamps.kernels.loader` builds it; callers keep torch's ops where it does not
load (no AVX2, no compiler, a failed check: with a warning that says why) or where
$FLEXLAMPS_NATIVE_KERNELS=0. Imports torch only.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.loader import require

SOURCE = build.SOURCES / "half_gemv.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx512"))
DTYPES = {torch.bfloat16: 0, torch.float16: 1}


def _plain(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor and t.device.type == "cpu" and not t.is_mkldnn and t.dim() == 2


def rows_and_out(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A 16-bit product's operands for its C call: x contiguous, an empty out (..., w's outputs) of x's
    dtype, and x's row count (0 for an empty inner dimension)."""
    n, k = w.shape
    x = x if x.is_contiguous() else x.contiguous()
    return x, torch.empty((*x.shape[:-1], n), dtype=x.dtype), x.numel() // k if k else 0


class HalfGemv:
    """The loaded kernels in one variant (`level`). `SYMBOLS`: the library's product and expert
    functions (`half_gemm`'s prompt kernels take the same arguments)."""
    SYMBOLS = ("flexlamps_half_gemv", "flexlamps_expert_swiglu")
    NAME = "half_gemv"

    def __init__(self, library: ctypes.CDLL, level: str = "avx512"):
        self.level = level
        self._gemv, self._expert = (getattr(library, symbol) for symbol in self.SYMBOLS)
        self._gemv.restype = self._expert.restype = ctypes.c_int
        self._gemv.argtypes = ([ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64]
                               + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 2)
        self._expert.argtypes = ([ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 3 + [ctypes.c_int64]
                                 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 2
                                 + [ctypes.c_int] * 2)

    @staticmethod
    def takes(w, x: torch.Tensor) -> bool:
        """Whether `matmul` runs x on w: CPU tensors of one 16-bit dtype, w a plain contiguous
        (out, in) tensor (x's dtype and device are the caller's to have checked: `DTYPES`, CPU)."""
        return _plain(w) and w.dtype == x.dtype and w.is_contiguous() and x.shape[-1] == w.shape[1]

    def matmul(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., in) @ w (out, in).T + b, rounded once to x's dtype (x on the CPU in a 16-bit dtype,
        `takes` holds; b contiguous, of x's dtype). Lean: a decode step calls it for every dense matrix."""
        x, out, rows = rows_and_out(x, w)
        n, k = w.shape
        if rows:
            rc = self._gemv(x.data_ptr(), rows, k, k, w.data_ptr(), n, None if b is None else b.data_ptr(),
                            out.data_ptr(), DTYPES[x.dtype], torch.get_num_threads())
            require(rc == 0, f"{self.NAME}: out of memory for its fp32 rows")
        return out

    @staticmethod
    def takes_expert(x: torch.Tensor, gate, up, down) -> bool:
        """Whether `expert_swiglu` runs: x (N, hidden) on the CPU in a 16-bit dtype, rows with a
        contiguous last dim, and the three matrices plain contiguous tensors of its dtype."""
        return (x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 2 and x.stride(-1) == 1
                and all(_plain(m) and m.dtype == x.dtype and m.is_contiguous() for m in (gate, up, down))
                and gate.shape == up.shape and gate.shape[1] == x.shape[1] and tuple(down.shape) == (x.shape[1], gate.shape[0]))

    def expert_swiglu(self, x: torch.Tensor, gate, up, down, picks: torch.Tensor, slots: int,
                      weights: torch.Tensor, out: torch.Tensor) -> None:
        """out[t] = round(out[t] + round(swiglu(x[t]) * weights[p])) for each pick p of `picks` (flat
        token * slots + slot positions, int64, contiguous; t = p // slots); `weights` the picks'
        flat fp32 routing weights, out (N, hidden) contiguous in x's dtype (`takes_expert` holds)."""
        if not picks.numel():
            return
        rc = self._expert(x.data_ptr(), x.stride(0), x.shape[1], gate.data_ptr(), up.data_ptr(), down.data_ptr(),
                          gate.shape[0], picks.data_ptr(), picks.numel(), slots, weights.data_ptr(), out.data_ptr(),
                          DTYPES[x.dtype], torch.get_num_threads())
        require(rc == 0, f"{self.NAME}: out of memory for an expert's fp32 rows")


def reference_swiglu(x: torch.Tensor, gate, up, down) -> torch.Tensor:
    """The expert as torch's ops compute it (models.blocks.moe.swiglu with torch's product)."""
    import torch.nn.functional as F

    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def check_products(kernel: HalfGemv, rows: int = 3, outs: int = 11, picks: tuple[int, ...] = (1, 4)) -> None:
    """Both of `kernel`'s products against torch, in each dtype, within the rounding of an fp32 sum in
    another order and one rounding to the dtype: `rows` x 37 @ `outs` x 37 (partial vectors and
    tiles), and an expert of 13 on the tokens `picks` (flat token * 2 + slot) picks of `rows` tokens."""
    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        x = torch.randn(rows, 37, generator=gen).to(dtype)
        w = torch.randn(outs, 37, generator=gen).to(dtype)
        b = torch.randn(outs, generator=gen).to(dtype)
        want = (x.float() @ w.float().T + b.float()).to(dtype)
        require(bool(torch.allclose(kernel.matmul(x, w, b).float(), want.float(), rtol=2 ** -7, atol=1e-3)),
                f"{kernel.NAME}: matmul's check failed in {dtype}")
        gate, up = torch.randn(2, 13, 37, generator=gen).to(dtype)
        down = torch.randn(37, 13, generator=gen).to(dtype) * 0.1
        pick = torch.tensor(picks, dtype=torch.int64)
        weights = torch.rand(2 * rows, generator=gen)
        out = torch.zeros(rows, 37, dtype=dtype)
        kernel.expert_swiglu(x, gate, up, down, pick, 2, weights, out)
        tokens = pick // 2
        y = reference_swiglu(x[tokens], gate, up, down)
        want = torch.zeros(rows, 37, dtype=dtype).index_add_(0, tokens, (y * weights[pick, None]).to(dtype))
        require(bool(torch.allclose(out.float(), want.float(), rtol=2 ** -5, atol=2e-2)),
                f"{kernel.NAME}: expert_swiglu's check failed in {dtype}")


KERNEL = loader.Kernel("half_gemv", SOURCE, VARIANTS, "the 16-bit decode products", "torch's 16-bit GEMM runs",
                       HalfGemv, check_products)


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> HalfGemv | None:
    """The kernels built into (or found in) `folder` and checked, or None where they cannot run
    here (the process's own: `loader.chosen().get("half_gemv")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel
