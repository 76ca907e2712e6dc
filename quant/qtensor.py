"""QTensor: a compressed tensor (packed codes + per-group scales/mins + what it was).

This is what `offload` stores on any tier: every field is a plain tensor, so `.to(device)`
moves it whole and `to_tensors()` / `from_tensors()` turn it into a flat dict that
safetensors can write to disk. Knows nothing of models or tiers.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math

import torch

from quant.config import QuantConfig

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def dtype_name(dtype: torch.dtype) -> str:
    """"float16" for torch.float16, etc.; a clear error for dtypes we do not quantize."""
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"cannot quantize a {dtype} tensor; convert it to one of {sorted(_DTYPES)} first")


@functools.lru_cache(maxsize=4096)
def _parse_meta(meta: bytes) -> tuple[tuple[int, ...], torch.dtype, QuantConfig]:
    """Shape, dtype and config from `to_tensors`' meta bytes. Cached: an offload engine rebuilds
    the same layers' QTensors every step, on an I/O thread whose Python holds the GIL."""
    data = json.loads(meta.decode())
    return tuple(data["shape"]), _DTYPES[data["dtype"]], QuantConfig.from_json(data["config"])


def _nbytes(part) -> int:
    if part is None:
        return 0
    if isinstance(part, torch.Tensor):
        return part.numel() * part.element_size()
    return part.nbytes


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """How a tensor of `shape` is viewed for grouping along one dim.

    The tensor is seen as `[outer, length, inner]`: `length` is the grouped dim,
    `outer`/`inner` are the products of the dims before/after it. Groups are
    `group_size` consecutive elements along `length`, so scales have shape
    `[outer, num_groups, 1, inner]` and need no transpose on either side.
    """

    outer: int
    length: int
    inner: int
    group_size: int

    @property
    def num_groups(self) -> int:
        return math.ceil(self.length / self.group_size)

    @property
    def padded_length(self) -> int:
        return self.num_groups * self.group_size

    @classmethod
    def of(cls, shape: tuple[int, ...], config: QuantConfig) -> "GroupLayout":
        if len(shape) == 0:  # a scalar is one group of one element
            return cls(1, 1, 1, config.group_size)
        dim = config.resolve_dim(len(shape))
        return cls(math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1 :]), config.group_size)


@dataclasses.dataclass(frozen=True)
class QTensor:
    """A group-wise quantized tensor.

    Attributes:
        codes: 1-D uint8. At 4 bits, ceil(n/2) bytes in `quant.pack`'s layout; at 8 bits,
            n bytes. Codes are stored unpadded, in the original tensor's row-major order.
        scales: `[outer, num_groups, 1, inner]` step per group, in the original dtype;
            itself an 8-bit QTensor of that when `config.param_bits == 8`.
        mins: same shape, each group's minimum (asymmetric); None when symmetric
            (the zero point is then the middle code, 2**(bits-1)).
        shape: the original shape.
        dtype: the original dtype; `dequantize` returns it by default.
        config: the QuantConfig used.
    """

    codes: torch.Tensor
    scales: "torch.Tensor | QTensor"
    mins: "torch.Tensor | QTensor | None"
    shape: tuple[int, ...]
    dtype: torch.dtype
    config: QuantConfig

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def layout(self) -> GroupLayout:
        return GroupLayout.of(self.shape, self.config)

    @property
    def nbytes(self) -> int:
        """Bytes held: packed codes + scales (+ mins)."""
        return sum(_nbytes(part) for part in (self.codes, self.scales, self.mins))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "QTensor":
        """The same compressed tensor on `device` (still compressed)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return dataclasses.replace(self, codes=move(self.codes), scales=move(self.scales), mins=move(self.mins))

    def pin_memory(self) -> "QTensor":
        """A page-locked copy, for async host-to-GPU copies."""
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return dataclasses.replace(self, codes=pin(self.codes), scales=pin(self.scales), mins=pin(self.mins))

    def dequantize(self, dtype: torch.dtype | None = None, device=None, out=None) -> torch.Tensor:
        from quant.groupwise import dequantize  # lazy (cycle): groupwise returns QTensors

        return dequantize(self, dtype=dtype, device=device, out=out)

    def to_tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Flat dict of tensors (safetensors-ready); shape, dtype and config go in `meta` as JSON bytes."""
        meta = json.dumps(
            {"shape": list(self.shape), "dtype": dtype_name(self.dtype), "config": self.config.to_json()}
        ).encode()
        tensors = {f"{prefix}codes": self.codes, f"{prefix}meta": torch.frombuffer(bytearray(meta), dtype=torch.uint8)}
        for key, part in (("scales", self.scales), ("mins", self.mins)):
            if isinstance(part, QTensor):  # 8-bit params: nested under "<key>."
                tensors.update(part.to_tensors(prefix=f"{prefix}{key}."))
            elif part is not None:
                tensors[f"{prefix}{key}"] = part
        return tensors

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> "QTensor":
        """Inverse of `to_tensors`; raises KeyError naming the missing key."""
        for key in ("codes", "meta"):
            if f"{prefix}{key}" not in tensors:
                raise KeyError(f"{prefix}{key} missing: not written by QTensor.to_tensors(prefix={prefix!r})")
        shape, dtype, config = _parse_meta(bytes(tensors[f"{prefix}meta"].cpu().numpy().tobytes()))

        def params(key: str):
            if f"{prefix}{key}.meta" in tensors:
                return cls.from_tensors(tensors, prefix=f"{prefix}{key}.")
            return tensors.get(f"{prefix}{key}")

        return cls(
            codes=tensors[f"{prefix}codes"],
            scales=params("scales"),
            mins=params("mins"),
            shape=shape,
            dtype=dtype,
            config=config,
        )

    def __repr__(self) -> str:
        return (
            f"QTensor(shape={self.shape}, dtype={self.dtype}, bits={self.config.bits}, "
            f"group_size={self.config.group_size}, group_dim={self.config.group_dim}, "
            f"nbytes={self.nbytes}, device={self.device})"
        )
