"""The weight-kind contract: how `linear` multiplies a weight, whatever form it is stored in.

A weight matrix (out, in) is held as one of a few kinds: dense (a tensor, packed or not), 4-bit
blocks (`quant.int4_weight.Int4Weight`), int8 codes (`quant.int8_weight.Int8Weight`: Q8_0, the
5-bit form, Q6_K), MXFP4 and FP8. Each kind is a `WeightKind` object that owns

- its product, `product(w, x, phase)` = x @ w.T (and `linear`, the product with a bias and a
  residual add or elementwise product applied), choosing the kernel it runs;
- its stored bytes, `stored_bytes(w)`: what holding `w` costs (a dense copy kept beside the codes
  included);
- what running it holds besides, asked of a shape (the executor's charges, on paper or not):
  `arrival_bytes` (a dense copy made when its layer arrives, held for the layer's run),
  `call_bytes` (a copy one call of so many rows makes), `sweep_bytes` (a dense copy kept for a
  whole sweep's calls, where `keeps_sweep_copy` says the sweep's calls want one).

`linear` asks `kind_of(w)` and never switches on the weight's type. A kernel (torch's, or ours
in `flexlamps.kernels`, per instruction set) is something a kind runs, not something `linear`
picks.

The rule every kind keeps, BATCH INVARIANCE: row i of `product(w, x, phase)` depends on x[i],
w and `phase` only -- never on how many rows share the call, where row i sits among them, or
what the other rows hold. The kernel a row takes and every reduction order in it (the split of
the inner dimension, the blocking, the rounding of x) are fixed by the row's phase, so a
sequence's output is the same bits in any batch, packing, chunking, shard or resume. A kind
may choose by `phase` (a decode kernel that reads the codes in place, a prompt kernel that
computes on them), by the dtype and device of x, and by this machine's CPU, never by the row
count. `tests/property/test_batch_invariance.py` checks the rule on whatever kernels run.

`phase` is PROMPT for the tokens of a prompt (several a row in a call) and DECODE for a
generated token (one a row); `phase_of` reads it from the activations' shape, which is how
every forward calls `linear`: the faces feed a prompt's tokens in chunks of two or more (see
`engine.batch.generate`) and decode one token a row.
"""

from __future__ import annotations

import enum
import math

import torch


class Phase(enum.Enum):
    PROMPT = "prompt"  # a prompt's tokens, several a row
    DECODE = "decode"  # one generated token a row


def phase_of(x: torch.Tensor) -> Phase:
    """x (..., T, in) from a forward: PROMPT when each row carries several tokens (T > 1), else
    DECODE (a 2-d x, e.g. a MoE expert's gathered tokens, counts as DECODE: pass the phase)."""
    return Phase.PROMPT if x.dim() >= 3 and x.shape[-2] > 1 else Phase.DECODE


def epilogue(out: torch.Tensor, b: torch.Tensor | None = None, add: torch.Tensor | None = None,
             mul: torch.Tensor | None = None) -> torch.Tensor:
    """`out + b`, then `+ add` or `* mul`, in place on a product's fresh output (the same values;
    out of place where a dtype differs, as torch would promote). Elementwise: row-invariant."""
    if b is not None:
        out = out.add_(b) if b.dtype == out.dtype else out + b
    if add is not None:
        return out.add_(add) if add.dtype == out.dtype else out + add
    if mul is not None:
        return out.mul_(mul) if mul.dtype == out.dtype else out * mul
    return out


class WeightKind:
    """One way of holding a weight matrix (out, in) and multiplying by it.

    Subclasses implement `product`; `linear` and `stored_bytes` have defaults. Every method
    keeps the module's rule: a row's arithmetic depends on the row and its phase, never on the
    call (how many rows, which neighbours)."""

    name: str = "weight"

    def product(self, w, x: torch.Tensor, phase: Phase) -> torch.Tensor:
        """x (..., in) @ w.T -> (..., out), in x's dtype."""
        raise NotImplementedError

    def linear(self, w, x: torch.Tensor, phase: Phase, b: torch.Tensor | None = None,
               add: torch.Tensor | None = None, mul: torch.Tensor | None = None) -> torch.Tensor:
        """`product`, then `+ b`, then `+ add` or `* mul` (a kind may fuse these into its kernel
        when the bits stay those of the unfused ops)."""
        return epilogue(self.product(w, x, phase), b, add, mul)

    def stored_bytes(self, w) -> int:
        """Bytes holding `w` costs (codes, scales, any dense copy kept beside them)."""
        return int(w.nbytes)

    # -- what running a weight of `shape` holds beside its stored bytes, in `dtype_bytes` values ----
    def arrival_bytes(self, shape, dtype_bytes: int) -> int:
        """Held while its layer runs: a dense copy made when the layer arrives (0: none)."""
        return 0

    def call_bytes(self, shape, rows: int, dtype_bytes: int, *, fused: bool = True) -> int:
        """Held during one call of `rows` rows: a copy the call multiplies instead of the stored
        form (0: the stored form is multiplied as it is). `fused`: the device multiplies this
        kind in place for a shape like this one (a planned GPU's kernel rule)."""
        return 0

    def sweep_bytes(self, shape, dtype_bytes: int) -> int:
        """Held for a whole sweep when `keeps_sweep_copy`: a dense copy serving all its calls."""
        return 0

    def keeps_sweep_copy(self, call_rows) -> bool:
        """Whether a sweep whose calls have `call_rows` rows each is served by one dense copy a
        matrix (`sweep_bytes`) rather than a copy a call."""
        return False

    def __repr__(self) -> str:
        return f"<{self.name} weights>"


class ExpandedOnArrival(WeightKind):
    """A compressed form no kind multiplies as stored (group-wise `quant.QTensor`, bitsandbytes'
    forms): the offload store dequantizes it when its layer arrives, and the calls multiply that
    dense copy. Not registered: `linear` never sees the stored form."""

    name = "expanded on arrival"

    def product(self, w, x: torch.Tensor, phase: Phase) -> torch.Tensor:
        raise TypeError(f"{type(w).__name__} is dequantized when its layer arrives, not multiplied as stored")

    def arrival_bytes(self, shape, dtype_bytes: int) -> int:
        return math.prod(shape) * dtype_bytes


EXPANDED_ON_ARRIVAL = ExpandedOnArrival()

# the weight's Python type -> its kind; a type not listed is a dense tensor (`KINDS[torch.Tensor]`)
KINDS: dict[type, WeightKind] = {}


def register(cls: type, kind: WeightKind) -> None:
    """Make `kind` multiply (and count the bytes of) every weight of type `cls`."""
    KINDS[cls] = kind


def kind_of(w) -> WeightKind:
    """The kind that multiplies `w`: its type's, else the dense kind's."""
    return KINDS.get(type(w)) or KINDS[torch.Tensor]


def is_dense(w) -> bool:
    """Whether `w` is a plain tensor (packed or not), not a compressed kind."""
    return kind_of(w) is KINDS[torch.Tensor]
