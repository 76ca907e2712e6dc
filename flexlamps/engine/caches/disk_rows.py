"""A cache layer on the disk tier: its buffers are files in the offload folder, mapped shared into
memory, so the operating system's page cache moves their pages between memory and the disk (what
FlexGen's disk tier does by hand), and no memory budget is charged for them. Each file is unlinked
as soon as it is mapped: nothing is left behind, whatever ends the run.

Imports torch and the standard library only (a `zeros` for `caches.tiered` and `quant.kv_rows`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
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


_MADV_WILLNEED = 3  # Linux's value


class PagesAhead:
    """Reads a disk-tier layer's pages into the page cache on a thread of its own, ahead of the layer
    that will use them (madvise MADV_WILLNEED: the kernel's readahead, in large reads). Without it
    a decode step faults them in from its compute thread a readahead window at a time, one read in
    flight: the 1000-prompt MoE job's 1008-row step spent ~0.5 s a layer so, where the plan prices
    the cache's disk reads overlapped with compute (`dtoc`). The data is the file's either way."""

    def __init__(self):
        self._pool = None

    def read(self, ranges: list[tuple[int, int]]) -> None:
        """Start reading the pages under each (address, bytes) of `ranges` (in a mapping: `span_ranges`);
        returns at once. Nothing where madvise is not there (off Linux)."""
        madvise = _madvise()
        if madvise is None or not ranges:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-pages-ahead")
        self._pool.submit(_will_need, madvise, ranges)

    def close(self) -> None:
        """Wait for the reads asked for (their mapping may be unmapped next)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def span_ranges(rows: torch.Tensor, span: int) -> list[tuple[int, int]]:
    """(address, bytes) of each (slot, head) row's first `span` positions in a layer's buffer view
    `rows` (slots, heads, capacity, head_dim), whole pages: what a step's attention reads of it, not
    the capacity past it (never written: holes, which a read would fill with zero pages)."""
    slots, heads, capacity, dim = rows.shape
    size = rows.element_size()
    row_bytes, stride = min(span, capacity) * dim * size, rows.stride(1) * size
    if rows.stride(0) != heads * rows.stride(1) or rows.stride(2) != dim or rows.stride(3) != 1:
        return []
    page, base = mmap.PAGESIZE, rows.data_ptr()
    out = []
    for r in range(slots * heads):
        start = base + r * stride
        aligned = start // page * page
        out.append((aligned, start + row_bytes - aligned))
    return out


def _will_need(madvise, ranges: list[tuple[int, int]]) -> None:
    for start, length in ranges:
        madvise(start, length, _MADV_WILLNEED)


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    fn = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn
