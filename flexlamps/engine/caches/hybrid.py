"""The cache of a hybrid model (Qwen3-Next, Qwen3.5): a KV cache over its full-attention layers
only, beside a recurrent-state cache (caches.state) for its gated-DeltaNet layers. Both executors
build it from their own KV cache kind, so its KV part is placed, compressed and charged as any
KV cache, and its state part by the same policy's cache fractions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from flexlamps.engine.caches.state import StateCache, StateStepRows
from flexlamps.engine.executors.step import Segments
from flexlamps.models.config import ModelConfig


def kv_view(cfg: ModelConfig) -> ModelConfig:
    """The model as its KV cache sees it: the full-attention layers only, numbered 0.. in order."""
    return dataclasses.replace(cfg, num_layers=cfg.num_kv_layers, hybrid=None)


@dataclass(frozen=True)
class HybridGeometry:
    kv: Any  # the KV cache's step geometry (None when it offers none)
    state: StateStepRows
    span: int  # cache positions the step's attention reads (0..span-1 of each row)


class HybridCache:
    packs_rows = False  # a packed row holds several sequences; a recurrent state holds one
    rewinds = False  # a row fed again from an earlier position would need the state there (caches.state)

    def __init__(self, cfg: ModelConfig, kv, state: StateCache):
        self.kv, self.state = kv, state
        hy = cfg.hybrid
        full, linear = hy.full_layers, hy.linear_layers
        # model layer -> ("kv", index among full layers) or ("state", index among DeltaNet layers)
        self._where = {i: ("kv", full.index(i)) if i in full else ("state", linear.index(i))
                       for i in range(cfg.num_layers)}

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    @property
    def num_slots(self) -> int:
        return self.state.num_slots

    @property
    def nbytes(self) -> int:
        return getattr(self.kv, "nbytes", 0) + self.state.nbytes

    def release(self) -> None:
        self.kv.release()
        self.state.release()

    def copy_prefix_from(self, src: "HybridCache", length: int, slots: torch.Tensor) -> None:
        """KV rows up to `length` and the DeltaNet states at `length` (a shared prefix's end)."""
        self.kv.copy_prefix_from(src.kv, length, slots)
        self.state.copy_prefix_from(src.state, length, slots)

    def step_geometry(self, slots: torch.Tensor, positions: torch.Tensor, segments: Segments | None = None,
                      lengths: torch.Tensor | None = None) -> HybridGeometry:
        """Once per step, before its layers: the KV cache's geometry and the state rows (checked
        to start or continue each row's state)."""
        if segments is not None:
            raise ValueError("packed rows (several sequences in one cache row) cannot share a recurrent "
                             "state; score hybrid models one sequence a row")
        kv = self.kv.step_geometry(slots, positions) if hasattr(self.kv, "step_geometry") else None
        return HybridGeometry(kv, self.state.begin_step(slots, positions, lengths), int(positions.max()) + 1)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
                  geometry: HybridGeometry | None = None):
        """A full-attention layer's `attend(q, k, v)`, or a DeltaNet layer's state access."""
        if geometry is None:
            raise ValueError("HybridCache.attend_fn needs the step's geometry (step_geometry, once per step)")
        kind, index = self._where[layer]
        if kind == "state":
            return self.state.access(index, geometry.state)
        if geometry.kv is None:
            return self.kv.attend_fn(index, slots, positions)
        return self.kv.attend_fn(index, slots, positions, geometry=geometry.kv)
