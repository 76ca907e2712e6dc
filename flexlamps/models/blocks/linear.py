"""`linear(x, w, b)`: the one matmul every forward and executor uses.

It asks the weight's kind (`weight_kind`: dense, 4-bit blocks, int8 codes, FP8, MXFP4) for the
product and never switches on the weight itself; the kinds live in `dense_gemm` and
`coded_weights`, and keep the contract's rule: a row's arithmetic depends on the row and its
phase (prompt or decode), never on how many rows share the call. Every executor calls this same
function, which keeps the plain, offloaded and scheduled paths bit-identical to each other.
"""

from __future__ import annotations

import torch

from flexlamps.models.blocks.coded_weights import (  # noqa: F401  (the names callers import from here)
    INT4_DENSE_FROM_ROWS, TWIN_PACK_AFTER_USES, Int4Twin, as_logits_head, can_have_dense_twin, codes_prompt_product,
    codes_serve_both_phases, fused_product, fuses, int8_kernel, int8_product, native_kernel, with_dense_twin)
from flexlamps.models.blocks.dense_gemm import pack, uses_onednn  # noqa: F401
from flexlamps.models.blocks.weight_kind import KINDS, Phase, kind_of, phase_of  # noqa: F401
from quant.compressed_weight import CompressedWeight


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None, *, add: torch.Tensor | None = None,
           mul: torch.Tensor | None = None, phase: Phase | None = None) -> torch.Tensor:
    """x (..., in) @ w (out, in).T + b, as `F.linear`; then `+ add` or `* mul` (same shape as the
    output). `phase`: the rows' phase where x's shape does not say it (`phase_of`)."""
    if add is not None and mul is not None:
        raise ValueError("linear: pass add= or mul=, not both")
    return kind_of(w).linear(w, x, phase or phase_of(x), b, add, mul)


def unpack(w) -> torch.Tensor:
    """The dense (out, in) weight, packed or not (for export and for torch's own linear)."""
    if isinstance(w, Int4Twin):
        w = w.int4
    if isinstance(w, CompressedWeight):
        return w.dequantize()
    return w.to_dense() if w.is_mkldnn else w
