"""Decode's dense bf16 products on AMX tiles (`half_amx.c`), compiled on first use in the "amx"
variant (AMX-BF16 CPUs) and loaded with ctypes.

On an AMX CPU a bf16 decode row runs in a oneDNN call of exactly `dense_gemm.AMX_ROW_BLOCK` (32)
rows, the batch-invariance rule's choice (oneDNN picks its kernel by the call's row count), and
that call reads a weight at 5-9 GB/s for one row, where the weight's bytes are all a decode row
costs: a MoE model's head and attention were ~40 of a batch-1 step's ~100 ms (docs/performance.md,
"MoE batch 1: where a step goes"). `matmul(x, w, b)` gives each row the bits of that 32-row call
(the same tile chain, `half_amx.c`), reading the weight as it lies, once for all the call's rows: a
row's bits never depend on the rows beside it, so `dense_gemm` sends every decode call on a plain
bf16 weight here, 1 row or a throughput job's 1008 (1.2-2.2x oneDNN's packed calls there). The load
check holds it to oneDNN's 32-row call bit for bit; where that fails (another oneDNN, a CPU whose
tiles sum otherwise) it does not run and every decode call is oneDNN's 32-row one. Imports torch only.
"""
from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.half_gemv import rows_and_out
from flexlamps.kernels.loader import require

SOURCE = build.SOURCES / "half_amx.c"
VARIANTS = (variants.variant("amx", ("amx_bf16", "avx512_bf16"), ("-mamx-bf16", "-mavx512bf16")),)
ONEDNN_ROWS = 32  # the rows of the oneDNN call whose bits these are (dense_gemm.AMX_ROW_BLOCK)


class HalfAmx:
    """The loaded kernel (`level`: the variant's)."""
    NAME = "half_amx"

    def __init__(self, library: ctypes.CDLL, level: str = "amx"):
        self.level = level
        self._matmul = library.flexlamps_half_amx
        self._matmul.restype = ctypes.c_int
        self._matmul.argtypes = ([ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64]
                                 + [ctypes.c_void_p] * 2 + [ctypes.c_int])

    @staticmethod
    def takes(w, x: torch.Tensor) -> bool:
        """Whether `matmul` runs x on w: bf16 CPU tensors, w a plain contiguous (out, in) tensor."""
        return (type(w) is torch.Tensor and w.device.type == "cpu" and not w.is_mkldnn and w.dim() == 2
                and w.dtype == x.dtype == torch.bfloat16 and w.is_contiguous() and x.shape[-1] == w.shape[1]
                and x.device.type == "cpu")

    def matmul(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., in) @ w (out, in).T + b, rounded once to bf16 (`takes` holds; b contiguous bf16)."""
        x, out, rows = rows_and_out(x, w)
        n, k = w.shape
        if rows:
            rc = self._matmul(x.data_ptr(), rows, k, k, w.data_ptr(), n, None if b is None else b.data_ptr(),
                              out.data_ptr(), torch.get_num_threads())
            require(rc != -2, f"{self.NAME}: the process may not use the AMX tiles (arch_prctl refused)")
            require(rc == 0, f"{self.NAME}: out of memory for x's tiles")
        return out


def onednn_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x's rows (at most ONEDNN_ROWS) through oneDNN's call of ONEDNN_ROWS rows, padded with zero rows."""
    padded = torch.nn.functional.pad(x, (0, 0, 0, ONEDNN_ROWS - x.shape[0]))
    return torch.ops.mkldnn._linear_pointwise(padded, w, b, "none", [], "")[:x.shape[0]]


def check_products(kernel: HalfAmx) -> None:
    """`matmul` against oneDNN's 32-row call, bit for bit: whole and partial tiles of outputs and
    inputs (an odd inner dimension too), one and two row tiles, with and without a bias."""
    gen = torch.Generator().manual_seed(0)
    for rows, outs, k, bias in ((1, 64, 128, False), (3, 37, 45, True), (20, 50, 96, False), (32, 16, 33, True)):
        x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        w = torch.randn(outs, k, generator=gen).to(torch.bfloat16)
        b = torch.randn(outs, generator=gen).to(torch.bfloat16) if bias else None
        require(torch.equal(kernel.matmul(x, w, b), onednn_rows(x, w, b)),
                f"{kernel.NAME}: matmul's check failed: not oneDNN's 32-row bits ({rows} x {k} @ {outs} x {k}, "
                f"bias {bias})")


def _unfit(variant: variants.Variant) -> str | None:
    """Why this process cannot run the kernel: it gives the bits of oneDNN's bf16 call on AMX, which a
    oneDNN capped below AMX ($ONEDNN_MAX_CPU_ISA, as a simulated AVX2 box sets it) never makes (capped
    at AVX2 it makes no bf16 call at all); None where it can."""
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").strip().upper()
    if isa in ("ALL", "DEFAULT") or "AMX" in isa:
        return None
    return f"$ONEDNN_MAX_CPU_ISA={isa}: oneDNN's bf16 calls, whose bits it gives, do not run on AMX here"


KERNEL = loader.Kernel("half_amx", SOURCE, VARIANTS, "the bf16 decode products on AMX",
                       "oneDNN's 32-row calls run", HalfAmx, check_products, unfit=_unfit)


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> HalfAmx | None:
    """The kernel built into (or found in) `folder` and checked, or None where it cannot run here
    (the process's own: `loader.chosen().get("half_amx")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel
