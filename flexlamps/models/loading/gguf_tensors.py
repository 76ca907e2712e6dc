"""A GGUF tensor's bytes as the `gguf` package lays them out (where they lie in the file; one slab
of a stacked tensor), read as float in blocks of rows, and llama.cpp's q/k row interleaving undone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flexlamps.models.loading.errors import CheckpointError


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor's bytes lie in a GGUF file, as the `gguf` package lays them out."""
    tensor_type: Any  # gguf.GGMLQuantizationType
    item_dtype: np.dtype
    item_shape: tuple[int, ...]
    data_offset: int  # bytes from the file's start

    def read(self, path: Path) -> np.ndarray:
        """The tensor's raw items, read from the file (a copy of this tensor only)."""
        count = int(np.prod(self.item_shape))
        data = np.fromfile(path, dtype=self.item_dtype, count=count, offset=self.data_offset)
        if data.size != count:
            raise CheckpointError(f"{path}: a tensor is cut short; the file is truncated or damaged")
        return data.reshape(self.item_shape)

    def rows(self, start: int, stop: int) -> "GGUFTensor":
        """Rows start:stop along the first (numpy) dim: a piece of a matrix, read alone."""
        if len(self.item_shape) != 2 or not 0 <= start < stop <= self.item_shape[0]:
            raise CheckpointError(f"rows {start}:{stop} are not in a matrix of shape {self.item_shape}")
        return GGUFTensor(self.tensor_type, self.item_dtype, (stop - start, self.item_shape[1]),
                          self.data_offset + start * self.item_shape[1] * self.item_dtype.itemsize)

    def slab(self, index: int) -> "GGUFTensor":
        """Slab `index` along the first (numpy) dim: one expert of llama.cpp's stacked experts."""
        if len(self.item_shape) not in (2, 3) or not 0 <= index < self.item_shape[0]:
            raise CheckpointError(f"expert {index} is not in a stacked tensor of shape {self.item_shape}")
        rest = self.item_shape[1:]
        return GGUFTensor(self.tensor_type, self.item_dtype, rest,
                          self.data_offset + index * int(np.prod(rest)) * self.item_dtype.itemsize)


def dequantize_rows(data: np.ndarray, tensor_type, shape: tuple[int, ...], dtype: torch.dtype,
                    rows_per_chunk: int = 4096) -> torch.Tensor:
    """A GGUF tensor's values (computed in float32, as the gguf package does) in `dtype`, a block of
    rows at a time, so no float32 copy of a whole bf16 matrix is made (SmolLM2's table: 113 MiB)."""
    from gguf.quants import dequantize

    def values(rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(dequantize(rows, tensor_type), dtype=np.float32))

    if data.ndim < 2 or len(data) <= rows_per_chunk:
        return values(data).reshape(shape).to(dtype)
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(len(data), -1)
    for start in range(0, len(data), rows_per_chunk):
        chunk = values(data[start:start + rows_per_chunk])
        flat[start:start + len(chunk)] = chunk.reshape(len(chunk), -1)
    return out


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """LLaMA's row order of q/k rows (or biases) llama.cpp's converter interleaved per head for its rope."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
