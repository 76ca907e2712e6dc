"""Weights read out of fused checkpoint tensors (`weight_specs.FusedPart`): gpt-oss keeps a
layer's experts in one tensor per projection — dense (E, in, out) with gate and up interleaved
along `out`, or MXFP4 as `<name>_blocks` (E, out, in / 32, 16) and `<name>_scales` (E, out, in / 32).
Each expert is read on its own (one slab of the file), so experts stay separate weights that
can be placed on different tiers; MXFP4 ones stay 4-bit (`quant.mxfp4.Mxfp4Weight`)."""

from __future__ import annotations

from typing import Callable

import torch

from flexlamps.models.loading.errors import CheckpointError
from flexlamps.models.weight_specs import FusedPart, WeightSpec
from quant.mxfp4 import Mxfp4Weight

MXFP4_SUFFIXES = ("_blocks", "_scales")


class FusedParts:
    """Reads `FusedPart`s through `slab(name, index)` (the checkpoint's tensor `name`, slab
    `index`) and `has(name)`; `where` names the checkpoint in errors."""

    def __init__(self, slab: Callable[[str, int], torch.Tensor], has: Callable[[str], bool], where: str):
        self._slab, self._has, self._where = slab, has, where

    def is_mxfp4(self, part: FusedPart) -> bool:
        return not self._has(part.name) and all(self._has(part.name + s) for s in MXFP4_SUFFIXES)

    def names(self, part: FusedPart) -> tuple[str, ...]:
        """The checkpoint tensors `part` is read from: the fused tensor, or its MXFP4 blocks and scales."""
        return tuple(part.name + s for s in MXFP4_SUFFIXES) if self.is_mxfp4(part) else (part.name,)

    def _missing(self, part: FusedPart, spec: WeightSpec):
        return CheckpointError(f"{self._where}: tensor {part.name} (or its MXFP4 {part.name}_blocks and "
                               f"_scales), for {spec.name}, is missing from the checkpoint")

    def _rows(self, t: torch.Tensor, part: FusedPart) -> torch.Tensor:
        return t[part.start::part.stride]

    def read(self, part: FusedPart, spec: WeightSpec, dtype: torch.dtype) -> torch.Tensor:
        """`spec` in `dtype` (an MXFP4 part dequantized exactly as transformers does)."""
        if self.is_mxfp4(part):
            return self.read_mxfp4(part, spec, dtype).dequantize()
        if not self._has(part.name):
            raise self._missing(part, spec)
        t = self._slab(part.name, part.index)
        t = self._rows(t.T if part.transposed else t, part)
        self._check(part.name, tuple(t.shape), spec)
        return t.to(dtype).contiguous()

    def read_mxfp4(self, part: FusedPart, spec: WeightSpec, dtype: torch.dtype) -> Mxfp4Weight:
        if not self.is_mxfp4(part):
            raise self._missing(part, spec)
        blocks = self._rows(self._slab(part.name + "_blocks", part.index), part)  # (out, in / 32, 16)
        scales = self._rows(self._slab(part.name + "_scales", part.index), part)  # (out, in / 32)
        self._check(part.name + "_blocks", (blocks.shape[0], blocks.shape[1] * blocks.shape[2] * 2), spec)
        try:
            return Mxfp4Weight(blocks.reshape(blocks.shape[0], -1).contiguous(), scales.contiguous(), dtype)
        except ValueError as e:
            raise CheckpointError(f"{self._where}: {part.name}: {e}") from None

    def _check(self, name: str, shape: tuple[int, ...], spec: WeightSpec) -> None:
        if shape != spec.shape:
            raise CheckpointError(f"{self._where}: {name} gives {spec.name} the shape {shape}, expected {spec.shape}")
