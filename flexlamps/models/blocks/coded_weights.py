"""The compressed weight kinds (`weight_kind`): 4-bit blocks, int8 codes, FP8 and MXFP4.

A 4-bit weight (`quant.int4_weight.Int4Weight`) is multiplied in place by a fused kernel on its
codes: our own (`flexlamps.kernels.tile_gemv`, per instruction set, where the loader found one
for this CPU) or else torch's int4 kernel, for the activations' dtypes it takes. A Q8_0 weight
(`quant.int8_weight.Int8Weight`) runs the same kernels on its codes split into two 4-bit halves;
a Q6_K (groups of 16), the 5-bit and the 6-bit forms run in place on our kernel only (`fuses`). Otherwise the
weight is dequantized and takes the dense GEMM (`dense_gemm`).

An `Int4Twin` is such a weight with a dense copy kept beside it (made when first needed,
prepacked once used again: the in-memory executor's choice where memory allows), and, where the
int8 GEMM runs (`flexlamps.kernels.int8_gemm`: x in int8 per group of 64, the weight in int8
per output channel), an int8 copy. The copies hold the values a dequantization at call time
gives, so a twin and its plain weight give the same bits on every path.

An FP8 (`quant.fp8.Fp8Weight`) or MXFP4 (`quant.mxfp4.Mxfp4Weight`) weight is upcast to the
compute dtype for each call into this thread's reused buffer and runs the dense GEMM.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Callable

import torch

from flexlamps.kernels import int8_gemm, loader, tile_gemv
from flexlamps.kernels.int8_gemm import Int8Matrix
from flexlamps.models.blocks.dense_gemm import dense_linear, dense_scratch, fast_dense_gemm, pack
from flexlamps.models.blocks.weight_kind import KINDS, Phase, WeightKind, epilogue, register
from quant.fp8 import Fp8Weight
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight
from quant.mxfp4 import Mxfp4Weight

# What the planner prices (placement's `int4_dense_from_rows`) and the executor charges (`CodesKind.
# call_bytes`): 4-bit calls of fewer rows on the fused kernel (decode batches), of more on the dense
# GEMM (prompt chunks). The kinds' products choose by phase, not by this count.
INT4_DENSE_FROM_ROWS = 128
# Calls a twin's dense copy serves unpacked before it is packed: packing costs more than it saves
# for a weight used once or twice (a first prompt).
TWIN_PACK_AFTER_USES = 2
_TWIN_DTYPES = (torch.float32, torch.bfloat16)  # dense copies on the CPU (`can_have_dense_twin`)


# The output head's decode x: its outputs are the logits, where 8-bit x's error lands unsoftened by
# later layers (measured: docs/performance.md, "The model blocks' choices").
LOGITS_X_BITS = 16


def native_kernel() -> tile_gemv.TileGemv | None:
    """This process's decode kernel for 4-bit and int8 weights, or None (not this CPU, no
    compiler, or switched off by $FLEXLAMPS_NATIVE_KERNELS=0: `flexlamps.kernels.loader`)."""
    return loader.chosen().get("tile_gemv")


def int8_kernel() -> int8_gemm.Int8Gemm | None:
    """This process's int8 GEMM, or None (`flexlamps.kernels.loader` says why)."""
    return loader.chosen().get("int8_gemm")


def _fused_for(w: Int4Weight | Int8Weight, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The fused product for `w` and activations like `x` (a twin keeps it), or None where no
    fused kernel takes them: the one place that decides."""
    kernel = native_kernel()
    if kernel is not None and kernel.runs(w, x):
        return kernel.bind(w)
    return w.matmul if w.can_run_fused(x) else None


# A plain weight's products from our kernel, by (kernel, activations' dtype, device): `_fused_for`
# and the kernel's binding cost several times the product's own Python on a decode row. A product
# holds the weight's tensors, not the weight, so an entry goes when its weight does.
_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plain_fused(w: Int4Weight | Int8Weight, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """`_fused_for(w, x)`, our kernel's product looked up once per weight, kernel, dtype and device."""
    kernel = native_kernel()
    key = (kernel, x.dtype, x.device)
    bound = _BOUND.get(w)
    if bound is not None and key in bound:
        return bound[key]
    fused = _fused_for(w, x)
    if fused is not None and kernel is not None and getattr(fused, "held", None) is not None:
        _BOUND.setdefault(w, {})[key] = fused  # (torch's `w.matmul` holds w: not kept)
    return fused


def fused_product(w: Int4Weight | Int8Weight, x: torch.Tensor) -> torch.Tensor:
    """x @ w.T computed on the codes in place (`fuses`)."""
    product = _fused_for(w, x)
    if product is None:
        raise ValueError(f"fused_product: neither our kernel nor torch's int4 kernel multiplies {w!r} "
                         f"by x in {x.dtype} on {x.device} (see `fuses`)")
    return product(x)


def fuses(w: Int4Weight | Int8Weight, x: torch.Tensor) -> bool:
    """Whether `fused_product` multiplies x by w: on our kernel, or on torch's (which does not
    take a Q6_K's groups of 16, nor the 5-bit form)."""
    return _fused_for(w, x) is not None


def codes_prompt_product(w: Int4Weight | Int8Weight, x: torch.Tensor) -> torch.Tensor | None:
    """x @ w.T for a prompt on the codes where they lie (our kernel's many-row product: x in int8
    per group, `TileGemv.prompt_product`), or None where it does not take them."""
    kernel = native_kernel()
    return kernel.prompt_product(w, x) if kernel is not None and kernel.runs_prompt(w, x) else None


def prompts_take_codes(x: torch.Tensor) -> bool:
    """Whether prompts of activations like x multiply the codes (`codes_prompt_product`) before a
    dense copy or the int8 GEMM: where the dense GEMM is slow for x's dtype (AVX2), and wherever our
    kernel runs (on AMX ~350 GFLOP/s a core on 4-bit codes; oneDNN's bf16 GEMM there runs ~750 on a
    dense copy of each matrix, 3x a Q4_0 model's memory, and gives a row other bits at other row
    counts; a 1.1B's 128-token prefill took as long either way). So every variant's prompts have
    the same bits; the int8 GEMM (the weight rounded again to int8 a row, x per 64 inputs: 0.021
    against 0.016 on the Q4_K_M test model's prefill logits at `FLEXLAMPS_CPU_VARIANT=avx512`)
    serves only what the codes' product does not take (AVX-512's 5-bit form)."""
    if not fast_dense_gemm(x):
        return True
    kernel = native_kernel()
    return x.device.type == "cpu" and x.dtype in tile_gemv.DTYPES and kernel is not None


def codes_serve_both_phases(w: Int4Weight | Int8Weight) -> bool:
    """Whether decode and prompts both multiply `w`'s codes here (`CodesKind`), so a dense copy would
    only hold memory: decode on our fused kernel, prompts on the many-row kernel (where the dense
    GEMM is slow for w's dtype) or the int8 GEMM (where it is fast)."""
    decode = native_kernel()
    if decode is None or not decode.takes(w) or not prompts_run_on_codes(w.dtype):
        return False
    if prompts_take_codes(torch.empty(0, dtype=w.dtype, device=w.device)) and decode.takes_prompt(w):
        return True
    return _int8_runs(w)  # (AVX-512's 5-bit form: the int8 GEMM)


def prompts_run_on_codes(dtype: torch.dtype) -> bool:
    """Whether this process multiplies both phases of `dtype` activations on 4-bit / int8 codes on
    the CPU (for the weights its kernels take), so no dequantized copy is made for them: our decode
    kernel, and for prompts the many-row kernel or, where the dense GEMM is fast, the int8 GEMM."""
    if native_kernel() is None or dtype not in tile_gemv.DTYPES:
        return False
    return prompts_take_codes(torch.empty(0, dtype=dtype)) or (int8_kernel() is not None and dtype in int8_gemm.DTYPES)


def _int8_runs(w: Int4Weight | Int8Weight) -> bool:
    """Whether `int8_product` takes prompts of activations in `w`'s dtype."""
    return (w.dtype in int8_gemm.DTYPES and int8_gemm.takes_width(w.shape[1]) and w.device.type == "cpu"
            and int8_kernel() is not None)


def int8_prompts_take(w: Int4Weight | Int8Weight, x: torch.Tensor) -> bool:
    """Whether prompts of activations like `x` can run `w` on the int8 GEMM (`int8_product`): where
    the dense GEMM is fast (`CodesKind.linear` takes it where the codes' product does not)."""
    return (fast_dense_gemm(x) and x.dtype == w.dtype and _int8_runs(w)
            and int8_gemm.can_take(x, tuple(w.shape)))


def int8_product(w, x: torch.Tensor) -> torch.Tensor | None:
    """x @ w.T on int8 codes where that kernel runs (a 4-bit or Q8_0 weight, x in its 16-bit
    dtype); else None. A twin keeps its int8 copy; a plain weight is rounded to one for this call."""
    plain = w.int4 if isinstance(w, Int4Twin) else w
    if x.dtype != plain.dtype or not _int8_runs(plain) or not int8_gemm.can_take(x, plain.shape):
        return None
    kernel = int8_kernel()
    return kernel.matmul(x, w.int8 if isinstance(w, Int4Twin) else kernel.pack_weight(plain))


class Int4Twin:
    """A 4-bit or int8 weight and its dense copy in the compute dtype, prepacked for the GEMM.

    The dense copy comes from `plain` (the dequantized matrix, or a function that reads it, e.g.
    from the weight cache, and gives None when it cannot) or else by dequantizing, when first
    needed; it serves its first `TWIN_PACK_AFTER_USES` calls as it is and is packed from the next
    one on (packed and plain give the same bits). Every result is the same whenever it is made."""

    __slots__ = ("int4", "_plain", "_dense", "_int8", "_uses", "_fused_on", "_fused")

    def __init__(self, int4: Int4Weight | Int8Weight,
                 plain: torch.Tensor | Callable[[], torch.Tensor | None] | None = None):
        self.int4 = int4
        self._fused_on = None  # the (dtype, device) of activations the fused kernel was found to take
        self._fused = None  # and the product it runs for them (`_fused_for`'s choice)
        self._plain = plain
        self._dense = None
        self._int8 = None  # the int8 copy `int8_product` multiplies, made when first needed
        self._uses = 0

    @property
    def dense(self) -> torch.Tensor:
        """The dense (out, in) copy: plain for its first calls, then packed (opaque oneDNN layout)."""
        if self._dense is not None:
            return self._dense
        # NOTE(speed): two threads racing here make equal values
        plain = self._plain() if callable(self._plain) else self._plain
        if plain is None or tuple(plain.shape) != tuple(self.int4.shape) or plain.dtype != self.int4.dtype:
            plain = self.int4.dequantize()
        self._uses += 1
        if self._uses > TWIN_PACK_AFTER_USES:
            self._dense, self._plain = pack(plain), None
            return self._dense
        self._plain = plain
        return plain

    def fused(self, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The fused product for activations like x (`_fused_for`), looked up once per dtype and
        device: a batch-1 decode step makes ~120 of these calls."""
        on = (x.dtype, x.device)
        if on != self._fused_on:
            fused = _fused_for(self.int4, x)
            if fused is None:
                return None
            self._fused, self._fused_on = fused, on
        return self._fused

    @property
    def int8(self) -> Int8Matrix:
        """The int8 copy (one scale per output channel) the int8 GEMM multiplies, made on first use."""
        if self._int8 is None:  # NOTE(speed): two threads racing here make equal copies
            self._int8 = int8_kernel().pack_weight(self.int4)
        return self._int8

    @property
    def shape(self) -> tuple[int, int]:
        return self.int4.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.int4.dtype

    @property
    def nbytes(self) -> int:
        """What the twin holds once its dense copy (and, where the int8 GEMM runs, its int8 copy)
        are made (charged up front)."""
        rows, cols = self.int4.shape
        int8 = rows * cols + 4 * rows if _int8_runs(self.int4) else 0
        return self.int4.nbytes + rows * cols * self.int4.dtype.itemsize + int8


class CodesKind(WeightKind):
    """4-bit blocks or int8 codes, plain or as an `Int4Twin`. The kernel is chosen by the phase,
    never by the row count (`weight_kind`'s rule):

    - DECODE: the fused kernel on the codes (ours, else torch's) wherever one takes x (ours: x in
      8 bits per group, an output head's in 16), else the dense GEMM on the twin's copy or a
      dequantization;
    - PROMPT: where `prompts_take_codes` (no fast dense GEMM for x's dtype, or our kernel runs),
      the codes where they lie, many rows a pass with x in int8 per group (`codes_prompt_product`:
      3x the decode kernel's rate at 128 rows on Zen 2), else as DECODE
      (torch's bf16 GEMM on an AVX2 CPU is slower than the fused kernels at every row count);
      elsewhere (oneDNN's GEMM: fp32 everywhere, bf16 on AVX-512 CPUs; a GPU) int8 codes
      (`int8_product`, where that kernel runs) or that GEMM.
    """

    dense_from_rows = INT4_DENSE_FROM_ROWS  # calls of this many rows charge a dense copy (`call_bytes`)

    def __init__(self, name: str):
        self.name = name

    def linear(self, w, x, phase, b=None, add=None, mul=None) -> torch.Tensor:
        twin = w if isinstance(w, Int4Twin) else None
        codes = twin.int4 if twin else w
        if phase is Phase.PROMPT and prompts_take_codes(x) and (out := codes_prompt_product(codes, x)) is not None:
            return epilogue(out, b, add, mul)
        if phase is Phase.DECODE or not fast_dense_gemm(x):
            fused = twin.fused(x) if twin else _plain_fused(codes, x)
            if fused is not None:
                return epilogue(fused(x), b, add, mul)
        elif (out := int8_product(w, x)) is not None:
            return epilogue(out, b, add, mul)
        dense = twin.dense if twin and x.dtype == twin.dtype else codes.dequantize(
            x.dtype, out=dense_scratch(codes.shape, x.dtype, x.device))
        return dense_linear(x, dense, b, add=add, mul=mul)

    def product(self, w, x, phase) -> torch.Tensor:
        return self.linear(w, x, phase)

    def stored_bytes(self, w) -> int:
        """Its parts as a store holds them: the code layouts it has (the kernel's included), the
        scales and zero points, the group size."""
        return sum(t.numel() * t.element_size() for t in w.to_tensors(with_kernel=True).values())

    def call_bytes(self, shape, rows: int, dtype_bytes: int, *, fused: bool = True) -> int:
        """A dequantized copy for a call on the dense path: `dense_from_rows` rows or more, or
        wherever the device has no fused kernel for it."""
        return math.prod(shape) * dtype_bytes if rows >= self.dense_from_rows or not fused else 0

    def sweep_bytes(self, shape, dtype_bytes: int) -> int:
        """The twin's dense copy (`Int4Twin`), made once for a sweep's calls."""
        return math.prod(shape) * dtype_bytes

    def keeps_sweep_copy(self, call_rows) -> bool:
        """Two calls or more on the dense path: one copy a matrix for the sweep, not one a call."""
        return sum(rows >= self.dense_from_rows for rows in call_rows) >= 2


class UpcastKind(WeightKind):
    """FP8 or MXFP4: upcast for this call only, into the thread's reused buffer, then the dense
    GEMM (the values a dequantization at load gives: the same bits)."""

    def __init__(self, name: str):
        self.name = name

    def linear(self, w, x, phase, b=None, add=None, mul=None) -> torch.Tensor:
        dense = w.dequantize(out=dense_scratch(w.shape, w.dtype, w.device))
        return dense_linear(x, dense, b, add=add, mul=mul)

    def product(self, w, x, phase) -> torch.Tensor:
        return self.linear(w, x, phase)

    def call_bytes(self, shape, rows: int, dtype_bytes: int, *, fused: bool = True) -> int:
        """Every call upcasts the whole matrix."""
        return math.prod(shape) * dtype_bytes


INT4 = CodesKind("4-bit blocks")
INT8 = CodesKind("int8 codes")
register(Int4Weight, INT4)
register(Int8Weight, INT8)
register(Fp8Weight, UpcastKind("FP8"))
register(Mxfp4Weight, UpcastKind("MXFP4"))


class _TwinKind(WeightKind):
    """An `Int4Twin` multiplies as its codes' kind does."""
    name = "twin"

    def linear(self, w, x, phase, b=None, add=None, mul=None) -> torch.Tensor:
        return KINDS[type(w.int4)].linear(w, x, phase, b, add, mul)

    def product(self, w, x, phase) -> torch.Tensor:
        return self.linear(w, x, phase)


register(Int4Twin, _TwinKind())


def as_logits_head(w):
    """`w` as an output head: a 4-bit or int8 weight whose decode product keeps x in
    LOGITS_X_BITS bits (the same codes, not copied; Q6_K's form's scales as the 6-bit form's,
    `Int8Weight.pairs`: its super-block products are for 8-bit x); any other weight as it is."""
    if isinstance(w, Int8Weight):
        return dataclasses.replace(w.pairs(), x_bits=LOGITS_X_BITS)
    if isinstance(w, Int4Weight):
        return dataclasses.replace(w, x_bits=LOGITS_X_BITS)
    return w


def can_have_dense_twin(w) -> bool:
    """Whether `with_dense_twin` makes `w` an `Int4Twin`: an `Int4Weight` or `Int8Weight` on the
    CPU, in fp32 or bf16."""
    return isinstance(KINDS.get(type(w)), CodesKind) and w.device.type == "cpu" and w.dtype in _TWIN_DTYPES


def with_dense_twin(w, plain=None):
    """An `Int4Weight` or `Int8Weight` (on the CPU, fp32 or bf16) as an `Int4Twin` (`plain`: its
    dense copy, or a function that reads it); any other weight as it is."""
    return Int4Twin(w, plain) if can_have_dense_twin(w) else w
