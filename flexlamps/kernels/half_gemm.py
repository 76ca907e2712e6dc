"""Prompts' products on plain bf16 / fp16 weights (`half_gemm.c`), compiled on first use in an AVX2
and an AVX-512 variant and loaded with ctypes, for CPUs without a fast 16-bit GEMM (no oneDNN
bf16: AVX2), where torch's runs a prompt's rows at ~1-5 GFLOP/s and MKL's fp32 GEMM needs the
weight converted on every call (an AVX-512 CPU multiplies bf16 with oneDNN, which `dense_gemm`
prefers; the kernel builds there too).

- `matmul(x, w, b)`: x @ w.T + b rounded once to x's dtype (the dense kind's prompt product);
- `expert_swiglu(...)`: one routed SwiGLU expert on its picked tokens, added into the layer's
  output with the roundings of `half_gemv`'s (a prompt's MoE experts, tokens grouped per expert).

Each output is one fp32 multiply-add chain over the inner dimension in order: a row's result
depends on that row and the weight only, never on how many rows share the call or the thread
count (`weight_kind`'s batch invariance); it differs from decode's (`half_gemv`: lane-wise sums)
by an fp32 sum's reordering, as a prompt's phase may. `KERNEL`'s check holds both to torch's
products within that. Callers keep their other products where it does not load. Imports torch only.
"""
from __future__ import annotations

import functools
from pathlib import Path

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.half_gemv import HalfGemv, check_products

SOURCE = build.SOURCES / "half_gemm.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx512"))  # products 8 lanes wide in both


class HalfGemm(HalfGemv):
    """The loaded kernels (`level`: the variant's): `matmul` and `expert_swiglu` take `HalfGemv`'s
    arguments and roundings, each product a prompt's."""
    SYMBOLS = ("flexlamps_half_gemm", "flexlamps_expert_swiglu_rows")
    NAME = "half_gemm"


# the check's shapes: two row tiles (one short), a partial panel, picks in both tiles
KERNEL = loader.Kernel("half_gemm", SOURCE, VARIANTS, "the 16-bit prompt products", "torch's 16-bit GEMM runs",
                       HalfGemm, functools.partial(check_products, rows=7, outs=29, picks=(1, 4, 13)))


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> HalfGemm | None:
    """The kernels built into (or found in) `folder` and checked, or None where they cannot run here
    (the process's own: `loader.chosen().get("half_gemm")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel
