"""The dense weight kind: x @ w.T on a plain (out, in) tensor, prepacked or not.

On the CPU, fp32 and bf16 go through oneDNN's linear instead of `F.linear` (MKL): faster on
prompt chunks and decode batches (docs/performance.md, "The model blocks' choices"). Weights may be
given in their ordinary layout (offloaded and compressed weights arrive that way, and oneDNN
reorders them on each call) or prepacked once by `pack` (resident weights: the reorder is
saved). Both give bit-identical results, and every executor calls
the same function, which keeps the plain, offloaded and scheduled paths bit-identical.

`add=` and `mul=` apply a residual add or an elementwise product to the output. In fp32 they run
inside the GEMM (a oneDNN post-op) and equal the unfused `product + add` bit for bit. In bf16 a
post-op would skip the rounding of the GEMM's output that transformers performs, so there they
run as a separate op.

Batch invariance (`weight_kind`): oneDNN's fp32 GEMM switches to a GEMV with another summation
order for a single row, so a single row is computed as two. torch's bf16 GEMM on AVX2 CPUs (no
oneDNN bf16 there) and oneDNN's on AVX-512-BF16 CPUs without AMX give each row the same bits at
any row count (measured: `tests/property/test_batch_invariance.py`); on CPUs with AMX oneDNN
picks its bf16 kernel by row count and a row may move by one bf16 rounding step of the output
(`BF16_BATCH_TOLERANCE`), a limit `docs/generate.md` states.

Decode rows in bf16 / fp16 on a CPU without oneDNN's 16-bit GEMM (AVX2) take our kernel
(`kernels.half_gemv`: each output one fp32 dot product in a fixed order, rounded once; a row's
bits its own): torch's 16-bit GEMM there runs 3-5 GFLOP/s, 3x slower at 8 rows (768 x 2048, Zen 2),
and a MoE model's batch-64 decode step spent 110 of 135 ms in it. Prompt rows there take
`kernels.half_gemm` (one fp32 multiply-add chain an output, the weight converted a panel at a time):
34 GFLOP/s against torch's 5 at 1024 rows of a 4096 x 2048 matrix (1 thread, CPU time, Zen 1-class EPYC).
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from flexlamps.kernels import half_gemv, loader
from flexlamps.models.blocks.weight_kind import Phase, WeightKind, epilogue, is_dense, register

# The row count oneDNN tunes a packed layout for; results do not depend on it, and decode
# batches of 8-64 rows and prefill GEMMs of thousands both run at full speed with it.
_PACK_ROWS_HINT = 32
# How far a bf16 row may move with the batch it shares a call with on a CPU with AMX: one
# rounding step of the bf16 output (up to 2^-7 of the value), plus the worst-case reordering
# error of an fp32 accumulation over K <= 4096 terms (K * 2^-24 of the row's sum of |x_i * w_i|).
BF16_BATCH_TOLERANCE = {"rel": 2.0 ** -7, "abs_of_magnitude": 2.0 ** -12}
_SCRATCH = threading.local()  # per thread: the buffer compressed weights are dequantized into


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
_ONEDNN_DTYPES = _onednn_dtypes() if _ONEDNN else (torch.float32,)
# rows in these dtypes take the native 16-bit kernels on the CPU, decode's and a prompt's (`half_product`)
_HALF_DECODE_DTYPES = tuple(d for d in half_gemv.DTYPES if d not in _ONEDNN_DTYPES)


def uses_onednn(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (_ONEDNN and x.device.type == "cpu" and w.device.type == "cpu" and x.dtype == w.dtype
            and x.dtype in _ONEDNN_DTYPES and w.dim() == 2 and not x.requires_grad)


def fast_dense_gemm(x: torch.Tensor) -> bool:
    """Whether the dense GEMM runs fast for activations like x: oneDNN's (fp32 everywhere, bf16 on
    CPUs with AVX-512 or AMX) or a GPU's. torch's own bf16 GEMM on an AVX2 CPU is slower than the
    fused kernels on 4-bit and int8 codes at every row count (SmolLM2's shapes, 1 thread, Zen 2)."""
    return x.device.type != "cpu" or (_ONEDNN and x.dtype in _ONEDNN_DTYPES)


def pack(w: torch.Tensor) -> torch.Tensor:
    """w (out, in) in the layout the dense product computes fastest with; w itself where that is
    plain (or w is no dense tensor). The packed tensor is opaque (a oneDNN tensor of the same
    size); `linear.unpack` gives w back."""
    if not is_dense(w) or not uses_onednn(w, w) or w.is_mkldnn:
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), _PACK_ROWS_HINT)


def dense_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                 add: torch.Tensor | None = None, mul: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) @ w (out, in).T + b, as `F.linear`; then `+ add` or `* mul`."""
    other = add if add is not None else mul
    if other is not None and not (x.dtype == torch.float32 and uses_onednn(x, w)):
        out = dense_linear(x, w, b)
        return out + add if add is not None else out * mul
    if not uses_onednn(x, w):
        return F.linear(x, w.to_dense() if w.is_mkldnn else w, b)
    lead, out_dim = x.shape[:-1], w.shape[0]
    rows = x.reshape(-1, x.shape[-1])
    single = rows.shape[0] == 1
    if single:  # oneDNN runs one row as a GEMV (another summation order): run it as two
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


def dense_scratch(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer for one dequantized weight, reused by this thread's calls. glibc hands a block
    over 32 MiB back to the system when it is freed, so a fresh one would be paged in
    (zero-filled) on every call (docs/performance.md, "The model blocks' choices")."""
    numel = shape[0] * shape[1]
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
        # NOTE(offspeed): a normal tensor even when first made under inference_mode (the
        # executors' forwards): an inference tensor could not be written by a later call outside it
        with torch.inference_mode(False):
            buf = _SCRATCH.buf = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel].view(shape)


def half_product(x: torch.Tensor, w, b: torch.Tensor | None = None,
                 phase: Phase = Phase.DECODE) -> torch.Tensor | None:
    """x @ w.T + b by the native 16-bit kernel of `phase` (decode's `half_gemv`, a prompt's
    `half_gemm`) where it runs and torch's 16-bit GEMM is slow (a CPU without oneDNN's bf16), else None."""
    if x.dtype not in _HALF_DECODE_DTYPES or x.device.type != "cpu":
        return None
    kernel = loader.chosen().get("half_gemv" if phase is Phase.DECODE else "half_gemm")
    if kernel is None or not kernel.takes(w, x) or (b is not None and (b.dtype != x.dtype or not b.is_contiguous())):
        return None
    return kernel.matmul(x, w, b)


class DenseKind(WeightKind):
    """A plain tensor: the GEMM above; rows in 16 bits on an AVX2 CPU, the native kernel of their phase."""
    name = "dense"

    def product(self, w, x: torch.Tensor, phase: Phase) -> torch.Tensor:
        if (out := half_product(x, w, phase=phase)) is not None:
            return out
        return dense_linear(x, w)

    def linear(self, w, x, phase, b=None, add=None, mul=None) -> torch.Tensor:
        if (out := half_product(x, w, b, phase)) is not None:
            return epilogue(out, None, add, mul)
        return dense_linear(x, w, b, add=add, mul=mul)

    def stored_bytes(self, w) -> int:
        return w.numel() * w.element_size()


DENSE = DenseKind()
register(torch.Tensor, DENSE)
