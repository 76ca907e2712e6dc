"""What the compressed KV buffers share: the cache shape and dtype checks, the written
length, and measuring and moving their tensors. Imports torch only."""

from __future__ import annotations

import torch

from quant.config import QuantConfig
from quant.qtensor import _nbytes, dtype_name


class CompressedKVBuffer:
    """Base of `QuantizedKVBuffer` and `ChannelQuantizedKVBuffer`; subclasses name their
    tensors in `_TENSORS` (`mins` is added when the config keeps it)."""

    _TENSORS: tuple[str, ...] = ()

    def __init__(self, batch: int, num_heads: int, capacity: int, head_dim: int,
                 config: QuantConfig, dtype: torch.dtype) -> None:
        if config.param_bits != 16:
            raise ValueError(f"KV buffers keep group params in {dtype}; got param_bits={config.param_bits}, use 16")
        dtype_name(dtype)
        self.shape = (batch, num_heads, capacity, head_dim)
        self.config = config
        self.dtype = dtype
        self.length = 0  # tokens written so far (prefix [0, length) is valid)
        self.mins: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.shape[2]

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the whole capacity (codes, group params, any dense residual)."""
        return sum(_nbytes(getattr(self, name)) for name in (*self._TENSORS, "mins"))

    def _written(self, upto: int | None) -> int:
        """`upto` (default: every token written), checked against what was written."""
        upto = self.length if upto is None else upto
        if not 0 <= upto <= self.length:
            raise ValueError(f"upto={upto} is outside the {self.length} tokens written")
        return upto

    def _check_truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate to {length}: buffer holds {self.length} tokens")

    def to(self, device: torch.device | str):
        """A copy on `device` (still compressed), e.g. to swap a paused request's cache to CPU."""
        moved = object.__new__(type(self))
        moved.__dict__.update(self.__dict__)
        for name in self._TENSORS:
            setattr(moved, name, getattr(self, name).to(device))
        moved.mins = None if self.mins is None else self.mins.to(device)
        return moved
