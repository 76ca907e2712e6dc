"""Products of many rows (prompts) on int8 codes, on AVX-512 VNNI CPUs (`int8_gemm.c`),
compiled on first use and loaded with ctypes.

A prompt's products are compute-bound: oneDNN's bf16 GEMM runs them at ~87% of this core's bf16
peak, as transformers does, so a 4-bit model's prefill was no faster than a dense one. int8
products run at twice bf16's rate (vpdpbusd, as llama.cpp's block types and torch's `_int_mm`).
The weight is held as int8 with one scale per output channel (`Int8Matrix`, from a 4-bit or
Q8_0 weight's values: on SmolLM2 it moved WikiText-2 perplexity by -0.2%, noise); x is rounded
to int8 per group of 64 inputs, as llama.cpp rounds x per block of 32 (one scale per row moved
perplexity +3.7%, groups of 192 +1.1%, of 64 +0.5%). Sums within a group are exact in int32 and
scaled into fp32; one rounding to the dtype at the end. Together, prefill-scored perplexity 30.67
against the bf16 GEMM's 30.61 (fp32 30.64); decode-sized calls lose more greedy agreement, so
`models.linear` uses it for prompts only. A row's result does not depend on the batch or on the
thread count.

`KERNEL` is how `flexlamps.kernels.loader` builds it and checks it against `reference` in each
dtype; callers keep the bf16 GEMM where the CPU lacks AVX-512 VNNI or has AMX (oneDNN's bf16 GEMM
on AMX tiles outruns VNNI's int8 products 2-5x and, run in calls of a fixed row count by
`dense_gemm`, gives a row the same bits in any batch), no compiler is found, the check fails, or
$FLEXLAMPS_NATIVE_KERNELS=0.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
from pathlib import Path

import torch

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.loader import require

SOURCE = build.SOURCES / "int8_gemm.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx_vnni"),
            variants.variant("avx512", ("avx512_vnni",), ("-mavx512vnni",)))
GROUP = 64  # x's inputs per scale (the kernel's GROUP)
BLOCK = 16  # output columns per block of the packed weight
DTYPES = {torch.bfloat16: 0, torch.float16: 1}


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Matrix:
    """A weight (N, K) as int8 with a scale per output channel, packed for the kernel: blocks of
    16 output columns, each (K/4, 16, 4) bytes of `w + 128`; N padded to 16 (zero weights).
    `from_dense` is the plain statement; `Int8Gemm.pack` makes the same in one pass."""

    packed: torch.Tensor  # uint8 (ceil(N/16) * K * 16,)
    scale: torch.Tensor  # float32 (ceil(N/16) * 16,)
    shape: tuple[int, int]

    @classmethod
    def from_dense(cls, w: torch.Tensor) -> "Int8Matrix":
        """Round a dense (N, K) weight to int8, one scale per row: max |w| / 127."""
        rows, cols = _whole_groups(w.shape)
        wf = w.float()
        scale = wf.abs().amax(1) / torch.full((rows,), 127.0)  # true divisions, as the kernel's pack
        codes = (wf / torch.where(scale > 0, scale, 1)[:, None]).round_().clamp_(-127, 127)
        padded = -(-rows // BLOCK) * BLOCK
        shifted = torch.full((padded, cols), 128, dtype=torch.uint8)
        shifted[:rows] = (codes + 128).to(torch.uint8)
        packed = shifted.view(padded // BLOCK, BLOCK, cols // 4, 4).permute(0, 2, 1, 3).contiguous().view(-1)
        return cls(packed, torch.cat([scale, scale.new_zeros(padded - rows)]), (rows, cols))

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 4 * self.scale.numel()


def takes_width(cols: int) -> bool:
    """Whether a weight of `cols` inputs holds whole groups of x (the one width rule)."""
    return cols % GROUP == 0


def _whole_groups(shape: tuple[int, int]) -> tuple[int, int]:
    """`shape` (N, K) of a weight to pack, its K checked to hold whole groups of x."""
    if not takes_width(shape[1]):
        raise ValueError(f"Int8Matrix: the input dim {shape[1]} must be a multiple of {GROUP}")
    return shape


def can_take(x: torch.Tensor, shape: tuple[int, int]) -> bool:
    """Whether the kernel multiplies activations like `x` by a weight of `shape` (N, K)."""
    return (x.device.type == "cpu" and x.dtype in DTYPES and x.shape[-1] == shape[1] and takes_width(shape[1])
            and not x.requires_grad)


class Int8Gemm:
    """`matmul(x, w)`: x (..., K) in bf16 / fp16 times an `Int8Matrix`'s transpose, in x's dtype."""

    def __init__(self, library: ctypes.CDLL, level: str = "avx512"):
        self.level = level
        self._quantize, self._gemm = library.flexlamps_int8_quantize, library.flexlamps_int8_gemm
        self._quantize.restype = self._gemm.restype = None
        self._quantize.argtypes = ([ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_int] + [ctypes.c_void_p] * 3
                                   + [ctypes.c_int])
        self._gemm.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_int]
        self._pack = library.flexlamps_int8_pack
        self._pack.restype = None
        self._pack.argtypes = ([ctypes.c_void_p, ctypes.c_int] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2
                               + [ctypes.c_int])

    def pack(self, w: torch.Tensor) -> Int8Matrix:
        """`Int8Matrix.from_dense(w)` in one pass, for a dense w in fp32, bf16 or fp16 (the same
        codes and scales; 10x faster)."""
        matrix = self._empty(*_whole_groups(w.shape))
        self._pack_rows(matrix, 0, w.contiguous())
        return matrix

    def pack_weight(self, w) -> Int8Matrix:
        """A 4-bit or Q8_0 weight (`Int4Weight`, `Int8Weight`) packed from its exact fp32 values, a
        few rows at a time as `dequantize` makes them: no dense copy of the matrix is made (the int8
        one takes 1 byte a weight). Rounding its bf16 values instead cost +0.3% perplexity (SmolLM2)."""
        matrix = self._empty(*_whole_groups(w.shape))
        w.dequantize(torch.float32, out=lambda start, stop, values: self._pack_rows(matrix, start, values))
        return matrix

    def _empty(self, rows: int, cols: int) -> Int8Matrix:
        """A matrix to pack into, its padding rows (zero weights) already packed."""
        padded = -(-rows // BLOCK) * BLOCK
        matrix = Int8Matrix(torch.empty(padded * cols, dtype=torch.uint8), torch.empty(padded), (rows, cols))
        if padded > rows:
            self._pack(None, 0, rows, padded - rows, cols, matrix.packed.data_ptr(), matrix.scale.data_ptr(), 1)
        return matrix

    def _pack_rows(self, matrix: Int8Matrix, first: int, rows: torch.Tensor) -> None:
        kind = 2 if rows.dtype == torch.float32 else DTYPES.get(rows.dtype)
        if rows.dim() != 2 or rows.shape[1] != matrix.shape[1] or first + rows.shape[0] > matrix.shape[0]:
            raise ValueError(f"Int8Gemm.pack: rows {tuple(rows.shape)} from row {first} do not fit a weight "
                             f"of shape {matrix.shape}")
        if kind is None or rows.device.type != "cpu" or not rows.is_contiguous():
            raise ValueError(f"Int8Gemm.pack takes contiguous fp32, bf16 or fp16 rows on the CPU, got {rows.dtype}")
        self._pack(rows.data_ptr(), kind, first, rows.shape[0], rows.shape[1], matrix.packed.data_ptr(),
                   matrix.scale.data_ptr(), torch.get_num_threads())

    def matmul(self, x: torch.Tensor, w: Int8Matrix) -> torch.Tensor:
        """x (..., K) @ w.T for a packed weight."""
        if not can_take(x, w.shape):  # the kernel would read past x or the weight
            raise ValueError(f"Int8Gemm.matmul: x {tuple(x.shape)} {x.dtype} on {x.device} does not fit a weight of "
                             f"shape {w.shape}: bf16 / fp16 on the CPU, last dim {w.shape[1]}")
        flat, q, scale, init, out = self._quantized(x, w.shape[0])
        if flat.shape[0]:
            self._gemm(q.data_ptr(), scale.data_ptr(), init.data_ptr(), w.packed.data_ptr(), w.scale.data_ptr(),
                       out.data_ptr(), flat.shape[0], flat.shape[1], w.shape[0], w.shape[0], DTYPES[x.dtype],
                       torch.get_num_threads())
        return out.view(*x.shape[:-1], w.shape[0])

    def _quantized(self, x: torch.Tensor, n: int):
        """x's rows (contiguous inputs), their int8 codes, scales and group starts, and the output."""
        cols = x.shape[-1]
        rows = x.numel() // cols
        flat = x.reshape(rows, cols)
        if flat.stride(-1) != 1:
            flat = flat.contiguous()
        q = torch.empty(rows, cols, dtype=torch.int8)
        scale = torch.empty(rows, cols // GROUP, dtype=torch.float32)
        init = torch.empty(rows, cols // GROUP, dtype=torch.int32)
        if rows:
            self._quantize(flat.data_ptr(), rows, cols, flat.stride(0), DTYPES[x.dtype], q.data_ptr(),
                           scale.data_ptr(), init.data_ptr(), torch.get_num_threads())
        return flat, q, scale, init, torch.empty(rows, n, dtype=x.dtype)


def reference(x: torch.Tensor, w: Int8Matrix) -> torch.Tensor:
    """The kernel's arithmetic in torch: x's groups rounded to int8, exact int sums per group."""
    rows, cols = x.numel() // x.shape[-1], x.shape[-1]
    xf = x.reshape(rows, cols // GROUP, GROUP).float()
    amax = xf.abs().amax(-1, keepdim=True)
    # 127 / max as one correctly rounded fp32 division, as the kernel (a tie of x's rounding lands alike)
    codes = (xf * torch.where(amax > 0, torch.full_like(amax, 127) / amax, 0)).round_()
    n_pad = w.scale.numel()
    wq = w.packed.view(n_pad // BLOCK, cols // 4, BLOCK, 4).permute(0, 2, 1, 3).reshape(n_pad, cols).double() - 128
    sums = torch.einsum("rgk,ngk->rng", codes.double(), wq.view(n_pad, cols // GROUP, GROUP))
    out = (sums.float() * (amax[..., 0] / 127)[:, None, :]).sum(-1) * w.scale
    return out[:, :w.shape[0]].to(x.dtype).view(*x.shape[:-1], w.shape[0])


def _check(gemm: Int8Gemm) -> None:
    """Against `reference` on a shape with partial row and column tiles, within one rounding, in
    each dtype; the one-pass pack against `Int8Matrix.from_dense`."""
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(37, 128, generator=gen)
    w = Int8Matrix.from_dense(dense)
    packed = gemm.pack(dense)
    require(bool(torch.equal(packed.packed, w.packed) and torch.equal(packed.scale, w.scale)),
            "int8_gemm: the kernel's pack differs from Int8Matrix.from_dense")
    for dtype in DTYPES:
        x = torch.randn(6, 128, generator=gen).to(dtype)
        got, want = gemm.matmul(x, w).float(), reference(x, w).float()
        error = (got - want).abs().max().item()
        require(bool(torch.allclose(got, want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())),
                f"int8_gemm: the check failed in {dtype} (max error {error:.3g})")


AMX_FLAGS = ("amx_bf16",)  # with these, oneDNN's bf16 GEMM on AMX tiles is faster than this kernel
KERNEL = loader.Kernel("int8_gemm", SOURCE, VARIANTS, "the int8 GEMM", "products of many rows run the bf16 GEMM",
                       Int8Gemm, _check, AMX_FLAGS,
                       "this CPU has AMX: oneDNN's bf16 GEMM on its tiles is faster (called with a fixed row count)")


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> Int8Gemm | None:
    """The kernel built into (or found in) `folder` and checked, or None where it cannot run here,
    AMX or not (the process's own, which leaves AMX CPUs to oneDNN: `loader.chosen().get("int8_gemm")`)."""
    return loader.load(dataclasses.replace(KERNEL, faster_flags=()), Path(folder), level).kernel
