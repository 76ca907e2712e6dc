"""The gpu bytes a MoE model's weights stage while it runs, priced as the engine charges them.

The engine fills each layer's gpu share with its always-read tensors first (attention, router,
shared experts, norms), then with whole routed experts (`flexlamps.engine.executors.placement_map`).
A running layer stages its own always-read tensors off the gpu tier and the next layer's (the
prefetch), and of its routed experts as many as its calls can pick, those off the gpu tier first
(`PlacementCharges.staged_experts`); the output head stages one vocab chunk of its rows off the
gpu tier (a MoE model's are one piece, `placement_map._head_split`). With w the weights' gpu
fraction, D and L a layer's always-read and total bytes as stored, R the routed bytes a row's
calls pick, C a head chunk's bytes and V the head's:

    layer rows:  2 max(0, D - w L) + min(R, (1 - w) L)        head row:  min(C, (1 - w) V)

The max() is convex: the LP bounds it with an auxiliary variable (`placement.lp`). Each min() is
concave: its two arguments each bound it from above, so the search solves one branch per
interval of w between the min()s' kinks (`branches`), each exact there and an upper bound
elsewhere: the union of the branches' feasible fractions is the engine's. The affine memory rows
hold each min()'s chord (1 - w) R, below it, so that what reads them alone (the search's
pruning bounds) reads a lower bound; `extra` adds the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placement.affine import W_GPU, Affine

LAYER_ROWS = ("gpu_prefill", "gpu_decode")  # the rows that run layers (and stage their always-read tensors)


@dataclass(frozen=True, slots=True)
class Capped:
    """min(cap, (1 - w) whole) bytes in memory row `row`."""

    row: str
    cap: float
    whole: float

    @property
    def kink(self) -> float:
        """The w beyond which (1 - w) whole is the smaller."""
        return 1.0 - self.cap / self.whole


@dataclass(frozen=True, slots=True)
class WeightStaging:
    """A MoE model's staged weights in the gpu rows (see the module)."""

    dense: float  # D: a layer's always-read bytes as stored
    layer: float  # L: all its bytes as stored
    terms: tuple[Capped, ...]  # the min()s
    capped: frozenset[int] = frozenset()  # this branch's min()s priced at (1 - w) whole, the others at cap

    def chord(self, row: str) -> Affine:
        """The row's affine lower bound of its min()s: (1 - w) cap each."""
        cap = sum(t.cap for t in self.terms if t.row == row)
        return Affine(cap).add(-cap, W_GPU)

    def hinge(self) -> Affine:
        """D - w L: twice its positive part is a layer row's always-read staging (its own and the next layer's)."""
        return Affine(self.dense).add(-self.layer, W_GPU)

    def bound(self, row: str) -> Affine:
        """This branch's bound of the row's min()s, less their chord the row holds."""
        out = Affine()
        for i, t in enumerate(self.terms):
            if t.row == row and i in self.capped:  # (1 - w)(whole - cap)
                out.add(t.whole - t.cap).add(t.cap - t.whole, W_GPU)
            elif t.row == row:  # cap - (1 - w) cap
                out.add(t.cap, W_GPU)
        return out

    def capped_at(self, row: str, x: np.ndarray) -> float:
        """The row's min()s at fractions `x`."""
        return sum(min(t.cap, (1.0 - float(x[W_GPU])) * t.whole) for t in self.terms if t.row == row)

    def extra(self, row: str, x: np.ndarray) -> float:
        """Bytes the row stages at `x` beyond the chord it holds: with it, exactly the engine's charge."""
        hinge = 2.0 * max(0.0, self.hinge()(x)) if row in LAYER_ROWS else 0.0
        return hinge + self.capped_at(row, x) - self.chord(row)(x)

    def branches(self) -> list["WeightStaging"]:
        """One branch per interval of w between the min()s' kinks: beyond a kink, its min() at (1 - w) whole."""
        kinks = sorted({t.kink for t in self.terms if t.cap > 0})
        return [WeightStaging(self.dense, self.layer, self.terms, frozenset())] + [
            WeightStaging(self.dense, self.layer, self.terms,
                          frozenset(i for i, t in enumerate(self.terms) if t.cap > 0 and t.kink <= kink))
            for kink in kinks]
