"""A cache layer on the disk tier: its buffers are files in the offload folder, mapped shared into
memory, so the operating system's page cache moves their pages between memory and the disk (what
FlexGen's disk tier does by hand), and no memory budget is charged for them. Each file is unlinked
as soon as it is mapped: nothing is left behind, whatever ends the run.

Imports torch and the standard library only (a `zeros` for `caches.tiered` and `quant.kv_rows`).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import torch


def file_backed_zeros(folder: str | Path):
    """A `torch.zeros(shape, dtype=, device=)` whose tensors live in files under `folder` (the
    device is ignored: a file's pages are host memory)."""
    folder = Path(folder)

    def zeros(shape, *, dtype: torch.dtype, device=None) -> torch.Tensor:
        numel = math.prod(shape)
        if numel == 0:
            return torch.zeros(shape, dtype=dtype)
        folder.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=folder, prefix="flexlamps-cache-", suffix=".dat")
        try:
            os.ftruncate(fd, numel * torch.empty((), dtype=dtype).element_size())  # sparse: reads as zeros
            mapped = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping keeps the file's pages until the tensor is freed
        return mapped.view(tuple(shape))

    return zeros
