"""What every weight kept in a compressed form shares (`Int4Weight`, `Int8Weight`, `Fp8Weight`,
`Mxfp4Weight`): its parts are the tensors (or compressed weights) in the dataclass fields `PARTS`
names; they move to a device and into pinned memory together; on a tier they are written as a
flat dict under `<prefix><KIND>.<part>` beside a small int32 `layout` tensor and read back
from it. A kind adds how it dequantizes (and, where it has its own code layouts, how it moves);
how each kind multiplies is `flexlamps.models.blocks.linear`'s table of products.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch


def _nbytes(part) -> int:
    if part is None:
        return 0
    return part.nbytes if isinstance(part, CompressedWeight) else part.numel() * part.element_size()


class CompressedWeight:
    """The shared plumbing; subclasses are frozen dataclasses whose `PARTS` fields hold tensors
    (or compressed weights), None where a part is not held."""

    KIND: ClassVar[str]  # what its stored parts are named under: "<prefix><KIND>.<part>"
    PARTS: ClassVar[tuple[str, ...]]  # its fields holding tensors, the first always present

    @property
    def device(self) -> torch.device:
        return getattr(self, self.PARTS[0]).device

    @property
    def nbytes(self) -> int:
        """Bytes held: every part."""
        return sum(_nbytes(getattr(self, name)) for name in self.PARTS)

    def dequantize(self, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The dense (out, in) weight in `dtype` (default: the compute dtype); into `out` when given."""
        raise NotImplementedError

    def to(self, device: torch.device | str, non_blocking: bool = False):
        """The same weight on `device`, still compressed."""
        return self._each_part(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self):
        """A page-locked copy, for async host-to-GPU copies."""
        return self._each_part(lambda t: t.pin_memory())

    def _each_part(self, fn):
        return dataclasses.replace(self, **{name: None if getattr(self, name) is None else fn(getattr(self, name))
                                            for name in self.PARTS})

    @classmethod
    def part_names(cls, prefix: str = "") -> tuple[str, ...]:
        """The names `to_tensors` gives each part, then the layout."""
        return tuple(f"{prefix}{cls.KIND}.{name}" for name in (*cls.PARTS, "layout"))

    @classmethod
    def is_stored(cls, tensors, prefix: str = "") -> bool:
        """Whether `tensors` (a flat dict, or its keys) hold a weight of this kind under `prefix`."""
        return cls.part_names(prefix)[0] in tensors

    def to_tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Flat dict for safetensors and the disk tier: each part (as `_stored` writes it) and the layout."""
        names = self.part_names(prefix)
        out = {name: self._stored(getattr(self, part)) for name, part in zip(names, self.PARTS)}
        out[names[-1]] = torch.tensor(self._layout(), dtype=torch.int32)
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = ""):
        """Inverse of `to_tensors`."""
        names = cls.part_names(prefix)
        return cls._from_parts([tensors[name] for name in names[:-1]], [int(v) for v in tensors[names[-1]].tolist()])

    def _stored(self, part: torch.Tensor) -> torch.Tensor:
        """A part as written to a tier (a dtype numpy lacks viewed as bytes)."""
        return part

    def _layout(self) -> list[int]:
        """What besides the parts rebuilds the weight (block shape, compute dtype...), as ints."""
        raise NotImplementedError

    @classmethod
    def _from_parts(cls, parts: list[torch.Tensor], layout: list[int]):
        raise NotImplementedError
