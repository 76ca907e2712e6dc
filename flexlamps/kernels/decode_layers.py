"""Every decoder layer of a step (a decode step, or a prompt chunk where prompts run on the codes)
in one native call (`decode_layers.c`), compiled on first use in an AVX2 and an AVX-512 variant.

A SmolLM2 decode step ran ~10 kernel calls a layer from Python, with ~33 torch ops between them
(the rotation, the cache writes, the residual adds, views): at batch 1 that Python was ~40% of the
step, and it grew with the layers. The C loop calls the same kernels (`tile_gemv`, `elementwise`,
`attention`, handed over as function pointers) in the same order and does the rest with torch's
roundings, so a row's bits are the Python forward's (models/blocks/native_decode.py says which
models and steps take it).

`KERNEL` is how `flexlamps.kernels.loader` builds it and checks the one piece of arithmetic it
adds, the rotation, against `rotate_half_split` bit for bit (the residual add is checked by the
tests, with the whole step against the Python forward). $FLEXLAMPS_NATIVE_KERNELS=0 turns it off.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.loader import require

SOURCE = build.SOURCES / "decode_layers.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx512"))
DTYPES = {torch.bfloat16: 0}  # an fp16 cache is held in fp32 on the CPU (caches.dense): not this loop's
MAX_HEAD_DIM = 512  # decode_layers.c holds a head in stack buffers of 512 (rotate, rotate_heads)

_P, _I, _F, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int32


class Kernels(ctypes.Structure):
    """The other kernels' entry points the loop calls."""
    _fields_ = [("gemv", _P), ("gemm", _P), ("norm", _P), ("silu", _P), ("attention", _P), ("gemv_group", _P)]


class Matrix(ctypes.Structure):
    """One weight as tile_gemv's decode product takes it (its codes, 5- or 6-bit form's plane, scales and zeros)."""
    _fields_ = [("codes", _P), ("plane", _P), ("scale_zero", _P), ("n", _I), ("cols", _I), ("group", _I),
                ("tile", _I), ("kind", _I32), ("x_bits", _I32)]


class Layer(ctypes.Structure):
    """One layer's norms and weights; q, k and v apart (`qkv` zeros) where they are of different kinds."""
    _fields_ = [("attn_norm", _P), ("mlp_norm", _P), ("qkv", Matrix), ("o", Matrix), ("gate_up", Matrix),
                ("down", Matrix), ("q", Matrix), ("k", Matrix), ("v", Matrix), ("scale", _F), ("unused", _I32)]


class Step(ctypes.Structure):
    """One step's rows, tokens and sizes (decode_layers.c's `Step`)."""
    _fields_ = [("rows", _I), ("tokens", _I), ("hidden", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I),
                ("inter", _I), ("capacity", _I), ("first", _I), ("span", _I), ("slots", _P), ("positions", _P),
                ("cos", _P), ("sin", _P), ("mask", _P), ("k_cache", _P), ("v_cache", _P),
                ("eps", _F), ("fp16", _I32), ("bf16_dot", _I32), ("threads", _I32), ("keep", _P)]


class DecodeLayers:
    """The loaded loop: `run(kernels, step, layers, num_layers, x)`, and the rotation alone."""

    def __init__(self, library: ctypes.CDLL, level: str = "avx512"):
        self.library, self.level = library, level
        self._fn = library.flexlamps_decode_layers
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(Kernels), ctypes.POINTER(Step), ctypes.POINTER(Layer), _I, _P]
        self._rotate = library.flexlamps_rotate_heads
        self._rotate.restype = None
        self._rotate.argtypes = [_P] * 4 + [_I, _I, ctypes.c_int]

    def run(self, kernels: Kernels, step: Step, layers, num_layers: int, x: torch.Tensor) -> None:
        """x (rows * tokens, hidden), contiguous, through the layers in place; raises where a kernel refused."""
        status = self._fn(ctypes.byref(kernels), ctypes.byref(step), layers, num_layers, x.data_ptr())
        if status:
            why = {1: "a product refused its weight", 2: "the attention refused its shapes", 3: "no memory"}
            raise ValueError(f"decode_layers: {why.get(status, status)} (rows {step.rows}, hidden {step.hidden})")

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """x (heads, d) contiguous, each head rotated by cos and signed sin (d,) (`rope_tables`)."""
        if x.shape[1] > MAX_HEAD_DIM:
            raise ValueError(f"decode_layers.rotate: head size {x.shape[1]} is above {MAX_HEAD_DIM}")
        out = torch.empty_like(x)
        self._rotate(x.data_ptr(), cos.data_ptr(), signed_sin.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
                     DTYPES[x.dtype])
        return out


def _check(loop: DecodeLayers) -> None:
    """The rotation against `rotate_half_split`'s ops (x * cos + roll(x) * signed_sin, in bf16),
    bit for bit, on head sizes with and without a partial last vector."""
    gen = torch.Generator().manual_seed(0)
    for d in (16, 48, 64, 80):
        x, cos, sin = ((torch.randn(n, d, generator=gen) * 4).to(torch.bfloat16) for n in (5, 1, 1))
        want = (x * cos).add_(x.roll(d // 2, -1).mul_(sin))
        require(torch.equal(loop.rotate(x, cos[0], sin[0]), want),
                f"decode_layers: the rotation's check failed (head size {d})")


KERNEL = loader.Kernel("decode_layers", SOURCE, VARIANTS, "the native decode loop",
                       "decode steps run the layers from Python", DecodeLayers, _check)


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> DecodeLayers | None:
    """The loop built into (or found in) `folder` and checked, or None where it cannot run here
    (the process's own: `loader.chosen().get("decode_layers")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel
