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
any row count (measured: `tests/property/test_batch_invariance.py`). On CPUs with AMX oneDNN
picks its bf16 kernel (and its split over threads) by the call's row count: 1-10 of a row's 2048
outputs moved by a rounding step between calls of 1-33 rows and of 300 (Sapphire Rapids-class
Xeon). A call of a fixed row count gives a row the same bits wherever it sits among the call's
rows and whatever they hold (measured there, 1 and 2 threads, packed or not), so there bf16 rows
run in calls of exactly `AMX_ROW_BLOCK` rows (a prompt's: `AMX_PROMPT_ROW_BLOCK`), fewer padded with
zero rows, more ending in a call on the last block's worth (`_in_row_blocks`). Decode rows on a plain
weight take `kernels.half_amx` where it loads, at any row count: the bits of those 32-row calls (the same
tile chain, checked at load) with the weight read as it lies, at the memory's rate for one row (oneDNN's
32-row call: 5-9 GB/s; the head and attention were ~40 of a MoE batch-1 step's ~100 ms) and 1.2-2.2x
oneDNN's packed calls up to 1008 rows; `pack` leaves such weights plain.

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

from flexlamps.kernels import build, half_amx, half_gemv, loader
from flexlamps.models.blocks.weight_kind import Phase, WeightKind, epilogue, is_dense, register

# The row count oneDNN tunes a packed layout for; results do not depend on it, and decode
# batches of 8-64 rows and prefill GEMMs of thousands both run at full speed with it.
_PACK_ROWS_HINT = 32
# bf16 rows per oneDNN call on a CPU with AMX (see the docstring), decode's: a decode row pays a call of
# this many (measured: docs/performance.md, "The model blocks' choices")
AMX_ROW_BLOCK = 32
# ... a prompt's (its rows' bits depend on the phase, as `weight_kind`'s rule allows, never on the rows beside
# them): fewer calls for a long prompt, a short one pays a wider call (measured: the same place)
AMX_PROMPT_ROW_BLOCK = 128
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
# dtypes whose oneDNN kernel is picked by the row count here: run in calls of AMX_ROW_BLOCK rows
_ROW_BLOCK_DTYPES = (torch.bfloat16,) if torch.bfloat16 in _ONEDNN_DTYPES and "amx_bf16" in build.cpu_flags() else ()
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


def pack(w: torch.Tensor, *, for_decode: bool = True) -> torch.Tensor:
    """w (out, in) in the layout the dense product computes fastest with; w itself where that is
    plain (or w is no dense tensor). The packed tensor is opaque (a oneDNN tensor of the same
    size); `linear.unpack` gives w back. A bf16 weight stays plain where `kernels.half_amx` runs its
    decode rows (which read the weight as it lies, 1.2-2.2x oneDNN's packed calls at 1-1008 rows); a
    prompt's oneDNN call then reorders it (once a call: `_in_row_blocks` asks with `for_decode` False)."""
    if not is_dense(w) or not uses_onednn(w, w) or w.is_mkldnn or (for_decode and _stays_plain(w)):
        return w
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), _PACK_ROWS_HINT)


def dense_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *,
                 add: torch.Tensor | None = None, mul: torch.Tensor | None = None,
                 phase: Phase = Phase.DECODE) -> torch.Tensor:
    """x (..., in) @ w (out, in).T + b, as `F.linear`; then `+ add` or `* mul`. `phase`: the rows'
    (on an AMX CPU, the rows a bf16 call holds: `AMX_PROMPT_ROW_BLOCK` or `AMX_ROW_BLOCK`)."""
    other = add if add is not None else mul
    if other is not None and not (x.dtype == torch.float32 and uses_onednn(x, w)):
        out = dense_linear(x, w, b, phase=phase)
        return out + add if add is not None else out * mul
    if not uses_onednn(x, w):
        return F.linear(x, w.to_dense() if w.is_mkldnn else w, b)
    lead, out_dim = x.shape[:-1], w.shape[0]
    rows = x.reshape(-1, x.shape[-1])
    if x.dtype in _ROW_BLOCK_DTYPES:  # (add and mul ran apart above: bf16)
        if phase is not Phase.PROMPT and (amx := _amx_decode(rows, w, b)):
            return amx.matmul(rows, w, b).reshape(*lead, out_dim)  # the bits of the oneDNN calls below
        block = AMX_PROMPT_ROW_BLOCK if phase is Phase.PROMPT else AMX_ROW_BLOCK
        return _in_row_blocks(rows, w, b, block).reshape(*lead, out_dim)
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


def _stays_plain(w: torch.Tensor) -> bool:
    """Whether `pack` leaves w as it is: decode's rows on it take `kernels.half_amx`, which reads it plain."""
    return w.dtype in _ROW_BLOCK_DTYPES and _amx_decode(w[:1], w, None) is not None


def _amx_decode(rows: torch.Tensor, w, b: torch.Tensor | None) -> half_amx.HalfAmx | None:
    """`kernels.half_amx` where it loads and takes these decode rows on w: a plain weight (a prepacked one
    is oneDNN's layout), no bias or a contiguous bf16 one. Its rows have the bits of the 32-row oneDNN
    call (checked at load) and it reads the weight at the memory's rate for one row (oneDNN: 5-9 GB/s)."""
    kernel = loader.chosen().get("half_amx")
    if kernel is None or not kernel.takes(w, rows) or (b is not None and (b.dtype != rows.dtype or not b.is_contiguous())):
        return None
    return kernel


def _in_row_blocks(rows: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, block: int) -> torch.Tensor:
    """rows @ w.T + b in oneDNN calls of exactly `block` rows: the kernel and its split then never
    depend on how many rows share the call. Fewer rows than a block are padded with zero rows; more
    end in a call on the last `block` rows, which overlaps the one before instead of a padded copy of
    them all (a row's bits do not depend on where it sits in the call or what is beside it: the
    docstring above; the copy was ~20% of a 504-row MoE expert's product). An unpacked weight is
    packed once for a call of several blocks, not reordered by each."""
    count = rows.shape[0]
    rows = rows.contiguous()
    if count <= block:
        padded = F.pad(rows, (0, 0, 0, block - count)) if count < block else rows
        return torch.ops.mkldnn._linear_pointwise(padded, w if w.is_mkldnn else w.contiguous(), b, "none", [], "")[:count]
    weight = w if w.is_mkldnn else pack(w, for_decode=False)
    starts = list(range(0, count - block, block))
    outs = [torch.ops.mkldnn._linear_pointwise(rows[i:i + block], weight, b, "none", [], "") for i in starts]
    last = torch.ops.mkldnn._linear_pointwise(rows[count - block:], weight, b, "none", [], "")
    return torch.cat([*outs, last[len(starts) * block - (count - block):]])


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
        return dense_linear(x, w, phase=phase)

    def linear(self, w, x, phase, b=None, add=None, mul=None) -> torch.Tensor:
        if (out := half_product(x, w, b, phase)) is not None:
            return epilogue(out, None, add, mul)
        return dense_linear(x, w, b, add=add, mul=mul, phase=phase)

    def stored_bytes(self, w) -> int:
        return w.numel() * w.element_size()


DENSE = DenseKind()
register(torch.Tensor, DENSE)
