"""`linear(x, w, b)`: the one matmul every forward and executor uses.

On the CPU, fp32 and bf16 go through oneDNN's linear instead of `F.linear` (MKL): on this
class of machine it is 1.4-1.7x faster for both prefill GEMMs and small-batch decode. Weights
may be given in their ordinary layout (offloaded and compressed weights arrive that way, and
oneDNN reorders them on each call) or prepacked once by `pack` (resident weights: the
reorder is saved, 15-40% on decode-sized calls). Both give bit-identical results, and every
executor calls this same function, which keeps the plain, offloaded and scheduled paths
bit-identical to each other.

`add=` and `mul=` apply a residual add or an elementwise product to the output. In fp32 they
run inside the GEMM (a oneDNN post-op: no second pass over a large activation) and equal the
unfused `linear(x, w) + add` bit for bit. In bf16 a post-op would skip the rounding of the
GEMM's output that transformers performs, and greedy outputs would drift from it on near
ties, so there they run as a separate op.

In fp32 a result does not depend on which other rows share the call (a prompt decoded alone
equals the same prompt decoded in a batch). oneDNN keeps that for every row count except one,
where it switches to a GEMV with another summation order, so a single row is computed as two.
In bf16 the guarantee is weaker and stated as such: oneDNN picks its bf16 kernel by row count
on CPUs with AMX (Intel Xeon: AMX tiles for some counts, AVX-512-BF16 for others), and the
kernels accumulate in another order, so a row may differ by one bf16 rounding step of the
output between batch sizes (`BF16_BATCH_TOLERANCE`). On AVX-512-BF16 CPUs without AMX (AMD
Zen 4) it is exact. Parity tests that need bit-equality between batch shapes run in fp32.

A 4-bit weight (`quant.int4_weight.Int4Weight`) is multiplied in place by torch's fused int4
kernel when the call has few rows (decode) and the activations are in its dtype; with many
rows (prefill) or fp32 activations it is dequantized for this call and takes the dense path.
An `Int4Twin` (the weight with a dense copy made when first needed and packed once it is used
again, `with_dense_twin`; the in-memory executor's choice when memory allows) switches to the dense GEMM from fewer rows, since it has
nothing to dequantize first; the offload executor streams plain 4-bit weights, and gives a sweep
of several prompt chunks twins that switch where a plain weight does (one dequantization a
layer, not one a chunk). In bf16 the two
may therefore differ for calls of 16-127 rows by the kernels' rounding (fp32 is unaffected).

A Q8_0 weight (`quant.int8_weight.Int8Weight`: int8 codes and a scale per 32 inputs) runs the
same fused kernel on its codes split into two 4-bit halves. That wins only while the call reads
weights rather than computes (1-2 rows), so it switches to the dense GEMM from
`INT8_TWIN_DENSE_FROM_ROWS` rows as a twin (its dense copy made when first needed, as above) and
from `INT8_DENSE_FROM_ROWS` as a plain weight (dequantized per call); its dense copy holds the
values a dequantization at load gives, so fp32 keeps its exact results. A Q6_K weight (groups of
16) and the 5-bit form of Q5_x codes run in place on our AVX-512 kernel only (`fuses`), elsewhere
on their dense values.

On CPUs with AVX-512 VBMI and VNNI (Zen 4, Ice Lake and later Xeons) both fused products run
our own kernel instead (`flexlamps.kernels.tile_gemv`, compiled on first use into the cache folder): it reads
the same tile layout, rounds x to 16-bit integers per group of the weight's inputs (32, or a
Q6_K's 16; an error near bf16's own rounding of the output) and sums exactly in int32, 1.5-3x
faster than torch's kernel on one row
(weights in cache). Twins of either kind then run it below
`NATIVE_TWIN_DENSE_FROM_ROWS`. Its results still do not depend on the batch, and the in-memory
and offload engines get the same bits from it; `$FLEXLAMPS_NATIVE_KERNELS=0` switches it off.

On CPUs with AVX-512 VNNI but no AMX (whose bf16 tiles outrun it), calls of `INT8_GEMM_FROM_ROWS`
rows or more (prefill) of a 4-bit or
Q8_0 weight in bf16 / fp16 run on int8 codes instead of the dense GEMM (`flexlamps.kernels.int8_gemm`: x in
int8 per group of 64, the weight in int8 per output channel from its exact values, made once for
a twin and per call for a plain weight, so the engines agree): 1.7-1.9x the bf16 GEMM, +0.1%
perplexity. fp32 keeps the exact dense path.

An FP8 checkpoint's weight kept as stored (`quant.fp8.Fp8Weight`), and an MXFP4 one (gpt-oss's
experts, `quant.mxfp4.Mxfp4Weight`), is upcast to the compute dtype for each call and runs the dense path: the same values a dequantization at load gives,
so the same bits, with one matrix's dense copy alive at a time (in the buffer 4-bit weights are
dequantized into; `unpack` gives a fresh copy, which a caller may hold across calls).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from flexlamps.kernels import int8_gemm, loader, tile_gemv
from quant.fp8 import Fp8Weight
from quant.mxfp4 import Mxfp4Weight
from quant.int4_weight import Int4Weight
from flexlamps.kernels.int8_gemm import Int8Matrix
from quant.compressed_weight import CompressedWeight
from quant.int8_weight import Int8Weight

_ONEDNN_DTYPES = (torch.float32,)  # and bfloat16 where oneDNN has a bf16 GEMM (`_onednn_dtypes`)
# The row count oneDNN tunes a packed layout for; results do not depend on it, and decode
# batches of 8-64 rows and prefill GEMMs of thousands both run at full speed with it.
_PACK_ROWS_HINT = 32
# How far a bf16 row may move with the batch it shares a call with: one rounding step of the
# bf16 output (up to 2^-7 of the value), plus the worst-case reordering error of an fp32
# accumulation over K <= 4096 terms (K * 2^-24 of the row's sum of |x_i * w_i|), which matters
# only on outputs that cancel to near zero.
BF16_BATCH_TOLERANCE = {"rel": 2.0 ** -7, "abs_of_magnitude": 2.0 ** -12}
# From this many rows a 4-bit weight is dequantized and run as a dense GEMM (prefill); below it
# the fused kernel runs (decode batches). Measured on Zen 4, 1 thread, SmolLM2's stacked gate/up
# (3072x576) and down (576x1536): fused 0.8/0.3 ms vs dequantize + dense 9.5/1.1 ms at 16 rows,
# 9.4/5.5 vs 15.3/5.7 at 64, even at 128, 40/20 vs 25/12 at 256.
INT4_DENSE_FROM_ROWS = 128
# The same for an `Int4Twin`, whose dense copy is ready: the fused kernel below this many rows.
# Measured in SmolLM2's decode step (CPU seconds, 1 thread, Zen 4): fused/dense 35/71 ms at 2
# rows, 46/62 at 4, 74/74 at 8, 100/78 at 16, 176/135 at 32.
INT4_TWIN_DENSE_FROM_ROWS = 16
# Calls an `Int4Twin`'s dense copy serves unpacked before it is packed: oneDNN multiplies a plain
# matrix nearly as fast for one call (SmolLM2's stacked gate/up, 16 rows: 0.52 vs 0.48 ms) while
# packing it costs 1.3 ms and fresh pages (0.5 s of a first prompt's prefill over all matrices).
TWIN_PACK_AFTER_USES = 2
# A Q8_0 weight's fused call (two 4-bit halves, 1.25 bytes a weight) against the dense bf16 GEMM
# (2 bytes), weights streamed from memory (1 thread, Zen 4; SmolLM2's shapes cycled over 130 MiB):
# 3072x576 0.30/0.50 ms at 1 row, 0.37/0.53 at 2, 0.83/0.47 at 4; the tied head 49152x576
# 3.3/4.4 ms at 1 row, 4.1/4.5 at 2, 5.7/3.3 at 4. A twin runs the dense copy from 3 rows.
INT8_TWIN_DENSE_FROM_ROWS = 3
# A plain Q8_0 weight is dequantized for calls of this many rows (the fused call's time grows
# with the rows, a dequantization's does not; 0.5-0.9 G weights/s): the head 22 ms fused at 16 rows,
# 45-54 at 32, against 31-60 ms dequantized (load 3-4) + 6-11 ms of GEMM; 3072x576 at 32 rows
# 2.7 ms fused, about 4 dequantized.
INT8_DENSE_FROM_ROWS = 32
# With the AVX-512 decode kernel (`flexlamps.kernels.tile_gemv`, x in 16-bit codes) a twin of either kind runs
# it below this many rows. Against the packed bf16 GEMM (1 thread, Zen 4, matrices cycled so weights
# come from memory), 4-bit: 3072x576 0.32/0.33 ms at 8 rows, 576x1536 0.24/0.14; int8 twins
# (Q8_0, Q5_x) a little slower, and the step's other work the same either way.
NATIVE_TWIN_DENSE_FROM_ROWS = 8
# From this many rows a 4-bit or Q8_0 weight's product runs on int8 codes (`int8_product`) where the
# kernel runs: prefill chunks. SmolLM2 (1 thread, Zen 4): 1.74-1.88x the bf16 GEMM on its shapes;
# a 32 x 128-token prefill 5.0 -> 3.3 s; WikiText-2 perplexity scored by prefill +0.1% (30.67 vs
# 30.61 on the bf16 GEMM, fp32 30.64). Not for decode batches: at 8 rows, argmax agreement with
# fp32 (teacher-forced, 2040 steps) fell from 0.969 to 0.923 (x's int8 and the weight's per-channel
# int8 cost about 0.02 each), so calls of fewer rows keep 16-bit x.
INT8_GEMM_FROM_ROWS = 128
_TWIN_DTYPES = (torch.float32, torch.bfloat16)  # dense copies on the CPU (`can_have_dense_twin`)
_SCRATCH = threading.local()  # per thread: the buffer 4-bit weights are dequantized into


def _onednn_available() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
                and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
    except (AttributeError, RuntimeError):
        return False


def _onednn_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN multiplies here: bf16 needs AVX-512 (or AMX); on an AVX2-only CPU its
    primitive cannot be created ("could not create a primitive descriptor"), so bf16 runs torch's."""
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        bf16 = False
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


_ONEDNN = _onednn_available()
_ONEDNN_DTYPES = _onednn_dtypes() if _ONEDNN else _ONEDNN_DTYPES


def uses_onednn(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (_ONEDNN and x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == w.dtype
            and x.dtype in _ONEDNN_DTYPES and w.dim() == 2 and not x.requires_grad)


class Int4Twin:
    """A 4-bit weight and its dense copy in the compute dtype, prepacked for the GEMM: calls with
    few rows run the fused kernel on the codes (decode reads a quarter of the bytes), calls with
    many rows the dense GEMM with nothing to dequantize or reorder first.

    The dense copy comes from `plain` (the dequantized matrix, or a function that reads it, e.g.
    from the weight cache, and gives None when it cannot) or else by dequantizing, when first
    needed; it serves its first `TWIN_PACK_AFTER_USES` calls as it is and is packed for the GEMM
    from the next one on (packed and plain give the same bits). A load does no GEMM-sized work, a
    run that never multiplies many rows (batch-1 decode) never holds the copy, and a weight used
    once or twice (a first prompt) is never packed. Every result is the same whenever it is made."""

    __slots__ = ("int4", "_plain", "_dense", "_int8", "_uses", "dense_from_rows", "_fused_on", "_fused")

    def __init__(self, int4: Int4Weight | Int8Weight,
                 plain: torch.Tensor | Callable[[], torch.Tensor | None] | None = None,
                 dense_from_rows: int | None = None):
        self.int4 = int4
        # calls of this many rows run the dense copy, fewer the fused kernel; INT4_DENSE_FROM_ROWS
        # keeps a plain weight's choice (the offload executor's twins, for one sweep: the same bits)
        if dense_from_rows is None:
            kernel = native_kernel()
            dense_from_rows = (NATIVE_TWIN_DENSE_FROM_ROWS if kernel is not None and kernel.takes(int4)
                               else PRODUCTS[type(int4)].twin_dense_from_rows)
        self.dense_from_rows = dense_from_rows
        self._fused_on = None  # the (dtype, device) of activations the fused kernel was found to take
        self._fused = None  # and the product it runs for them (`fused_product`'s choice)
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

    def fused_matmul(self, x: torch.Tensor) -> torch.Tensor | None:
        """x @ w.T by the fused kernel when this call takes it (fewer rows than `dense_from_rows`,
        activations it multiplies), else None. The kernel's check is made once per dtype and
        device: a batch-1 decode step makes ~120 of these calls."""
        if x.numel() >= self.dense_from_rows * x.shape[-1]:
            return None
        on = (x.dtype, x.device)
        if on != self._fused_on:
            fused = _fused_for(self.int4, x)
            if fused is None:
                return None
            self._fused, self._fused_on = fused, on
        return self._fused(x)

    @property
    def int8(self) -> Int8Matrix:
        """The int8 copy (one scale per output channel) the int8 GEMM multiplies, made on first use
        (only where `int8_kernel` runs)."""
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


def int8_kernel() -> int8_gemm.Int8Gemm | None:
    """This process's AVX-512 VNNI int8 GEMM, or None (`flexlamps.kernels.loader` says why: not
    this CPU, a CPU with AMX, where oneDNN's bf16 GEMM is faster, no compiler, or switched off)."""
    return loader.chosen().get("int8_gemm")


def _int8_runs(w: Int4Weight | Int8Weight) -> bool:
    """Whether `int8_product` takes prompts of activations in `w`'s dtype."""
    return (w.dtype in int8_gemm.DTYPES and w.shape[1] % int8_gemm.GROUP == 0 and w.device.type == "cpu"
            and int8_kernel() is not None)


def int8_product(w: Int4Weight | Int8Weight | Int4Twin, x: torch.Tensor) -> torch.Tensor | None:
    """x @ w.T on int8 codes (`flexlamps.kernels.int8_gemm`) where it runs: a 4-bit or Q8_0 weight, x in its
    16-bit dtype (fp32 keeps the exact dense path) on a CPU with the kernel; else None. A twin
    keeps its int8 copy; a plain weight is rounded to one for this call."""
    plain = w.int4 if isinstance(w, Int4Twin) else w
    if x.dtype != plain.dtype or not _int8_runs(plain) or not int8_gemm.can_take(x, plain.shape):
        return None
    kernel = int8_kernel()
    if isinstance(w, Int4Twin):
        return kernel.matmul(x, w.int8)
    # 1 byte a weight and no dense copy: within what the budgets charge the dense path's dequantization
    return kernel.matmul(x, kernel.pack_weight(plain))


def native_kernel() -> tile_gemv.TileGemv | None:
    """This process's AVX-512 decode kernel for 4-bit and int8 weights, or None (not this CPU, no
    compiler, or switched off by $FLEXLAMPS_NATIVE_KERNELS=0: `flexlamps.kernels.loader`)."""
    return loader.chosen().get("tile_gemv")


def fused_product(w: Int4Weight | Int8Weight, x: torch.Tensor) -> torch.Tensor:
    """x @ w.T computed on the codes in place (x in the weight's dtype, `fuses`): by the
    AVX-512 kernel where it takes them, else by torch's fused int4 kernel."""
    product = _fused_for(w, x)
    if product is None:
        raise ValueError(f"fused_product: neither our AVX-512 kernel nor torch's int4 kernel multiplies {w!r} "
                         f"by x in {x.dtype} on {x.device} (see `fuses`)")
    return product(x)


def fuses(w: Int4Weight | Int8Weight, x: torch.Tensor) -> bool:
    """Whether `fused_product` multiplies x by w: on our AVX-512 kernel, or on torch's (which does
    not take a Q6_K's groups of 16, nor the 5-bit form)."""
    return _fused_for(w, x) is not None


def _fused_for(w: Int4Weight | Int8Weight, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The product `fused_product` runs for `w` and activations like `x` (a twin keeps it), or
    None where no fused kernel takes them: the one place that decides."""
    kernel = native_kernel()
    if kernel is not None and kernel.runs(w, x):
        return kernel.bind(w)
    return w.matmul if w.can_run_fused(x) else None


def can_have_dense_twin(w) -> bool:
    """Whether `with_dense_twin` makes `w` an `Int4Twin`: an `Int4Weight` or `Int8Weight` on the CPU,
    in fp32 or bf16."""
    # not only oneDNN's dtypes: on a CPU without a bf16 oneDNN GEMM (no AVX-512) torch's runs the copy
    kind = PRODUCTS.get(type(w))
    return (kind is not None and kind.twin_dense_from_rows is not None and w.device.type == "cpu"
            and w.dtype in _TWIN_DTYPES)


def with_dense_twin(w, plain=None):
    """An `Int4Weight` or `Int8Weight` (on the CPU, in a oneDNN dtype) as an `Int4Twin` (`plain`: its dense copy, or
    a function that reads it, as `Int4Twin` takes); any other weight as it is."""
    return Int4Twin(w, plain) if can_have_dense_twin(w) else w


def pack(w: torch.Tensor) -> torch.Tensor:
    """w (out, in) in the layout `linear` computes fastest with; w itself where that is plain.

    The packed tensor is opaque (a oneDNN tensor of the same size); `unpack` gives w back.
    """
    if type(w) in PRODUCTS or not uses_onednn(w, w) or w.is_mkldnn:
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), _PACK_ROWS_HINT)


def unpack(w: torch.Tensor) -> torch.Tensor:
    """The dense (out, in) weight, packed or not (for export and for torch's own linear)."""
    if isinstance(w, Int4Twin):
        w = w.int4
    if isinstance(w, CompressedWeight):
        return w.dequantize()
    return w.to_dense() if w.is_mkldnn else w


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
           add: torch.Tensor | None = None, mul: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) @ w (out, in).T + b, as `F.linear`; then `+ add` or `* mul` (same shape as the output)."""
    if add is not None and mul is not None:
        raise ValueError("linear: pass add= or mul=, not both")
    kind = PRODUCTS.get(type(w))
    if kind is not None:  # a compressed weight: its kind's product
        return kind.run(x, w, b, add, mul)
    other = add if add is not None else mul
    if other is not None and not (x.dtype == torch.float32 and uses_onednn(x, w)):
        out = linear(x, w, b)
        return out + add if add is not None else out * mul
    if not uses_onednn(x, w):
        return F.linear(x, unpack(w), b)
    lead = x.shape[:-1]
    out_dim = w.shape[0]
    rows = x.reshape(-1, x.shape[-1])
    single = rows.shape[0] == 1
    if single:
        rows = rows.expand(2, -1)
    rows = rows.contiguous()
    weight = w if w.is_mkldnn else w.contiguous()
    if other is None:
        out = torch.ops.mkldnn._linear_pointwise(rows, weight, b, "none", [], "")
    else:
        other_rows = other.reshape(-1, out_dim)
        if single:
            other_rows = other_rows.expand(2, -1)
        out = torch.ops.mkldnn._linear_pointwise.binary(
            rows, other_rows.contiguous(), weight, b, "add" if add is not None else "mul")
    if single:
        out = out[:1]
    return out.reshape(*lead, out_dim)


def _dense_scratch(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer for one dequantized weight, reused by this thread's calls. glibc hands a block
    over 32 MiB back to the system when it is freed, so a fresh one is paged in (zero-filled)
    on every call: on this project's 2-core VM that made writing TinyLlama's stacked gate/up
    (46 MiB in bf16) 95 ms instead of 13."""
    numel = shape[0] * shape[1]
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
        # NOTE(offspeed): a normal tensor even when first made under inference_mode (the
        # executors' forwards): an inference tensor could not be written by a later call outside it
        with torch.inference_mode(False):
            buf = _SCRATCH.buf = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel].view(shape)


def _twin_linear(x: torch.Tensor, w: Int4Twin, b: torch.Tensor | None, add, mul) -> torch.Tensor:
    """A twin's product: the fused kernel for few rows (decode, the step's most frequent call),
    else as its weight's codes say (`_codes_linear`) with the dense copy ready."""
    out = w.fused_matmul(x)
    if out is not None:
        return _epilogue(out, b, add, mul)
    return _codes_linear(x, w, b, add, mul)


def _upcast_linear(x: torch.Tensor, w: Fp8Weight | Mxfp4Weight, b: torch.Tensor | None, add, mul) -> torch.Tensor:
    """An FP8 or MXFP4 weight's product: upcast for this call only, into the thread's reused buffer."""
    return linear(x, w.dequantize(out=_dense_scratch(w.shape, w.dtype, w.device)), b, add=add, mul=mul)


def _codes_linear(x: torch.Tensor, w: Int4Weight | Int8Weight | Int4Twin, b: torch.Tensor | None,
                  add, mul) -> torch.Tensor:
    """A 4-bit or int8 weight's product: the fused kernel on its codes below its kind's row count
    (`Product.dense_from_rows`, a twin's own), else int8 codes (`int8_product`) where that runs
    for prompts, else the dense GEMM on its dense copy or a dequantization for this call."""
    rows = x.numel() // x.shape[-1]
    twin = w if isinstance(w, Int4Twin) else None
    w = twin.int4 if twin else w
    fused = None if rows >= (twin.dense_from_rows if twin else PRODUCTS[type(w)].dense_from_rows) else _fused_for(w, x)
    if fused is None:
        out = int8_product(twin or w, x) if rows >= INT8_GEMM_FROM_ROWS else None
        if out is not None:
            return _epilogue(out, b, add, mul)
        dense = twin.dense if twin and x.dtype == twin.dtype else w.dequantize(
            x.dtype, out=_dense_scratch(w.shape, x.dtype, x.device))
        return linear(x, dense, b, add=add, mul=mul)
    return _epilogue(fused(x), b, add, mul)


def _epilogue(out: torch.Tensor, b, add, mul) -> torch.Tensor:
    """`out + b`, then `+ add` or `* mul`, in place on the fused kernel's fresh output (the same
    values; out of place where a dtype differs, as torch would promote)."""
    if b is not None:
        out = out.add_(b) if b.dtype == out.dtype else out + b
    if add is not None:
        return out.add_(add) if add.dtype == out.dtype else out + add
    if mul is not None:
        return out.mul_(mul) if mul.dtype == out.dtype else out * mul
    return out


@dataclass(frozen=True)
class Product:
    """How one weight kind multiplies: `run(x, w, b, add, mul)`; a kind whose codes are multiplied
    in place also says from how many rows a plain weight, and its `Int4Twin`, take the dense GEMM."""
    run: Callable[..., torch.Tensor]
    dense_from_rows: int | None = None
    twin_dense_from_rows: int | None = None  # None: the kind has no twin (`can_have_dense_twin`)


# weight kind -> its product; any other weight is a dense matrix (packed or not) and runs the GEMM
PRODUCTS: dict[type, Product] = {
    Int4Twin: Product(_twin_linear),
    Int4Weight: Product(_codes_linear, INT4_DENSE_FROM_ROWS, INT4_TWIN_DENSE_FROM_ROWS),
    Int8Weight: Product(_codes_linear, INT8_DENSE_FROM_ROWS, INT8_TWIN_DENSE_FROM_ROWS),
    Fp8Weight: Product(_upcast_linear),
    Mxfp4Weight: Product(_upcast_linear),
}
