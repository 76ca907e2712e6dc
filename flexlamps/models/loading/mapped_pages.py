"""Giving back the resident pages of a memory-mapped file's weights that were replaced by copies.

The weight cache (`weight_cache`) maps its file: a weight's pages join the process's resident
set once read. Where the engine builds a new weight out of cached ones (q/k/v and gate/up stacked
into one matrix, `fuse_weights`), it reads the parts once and holds the copy, and the parts'
pages would stay resident beside it: a Q8_0 1.1B model's RSS counted its stacked matrices twice
(2.8 GB against llama.cpp's 1.1 GB). `release_mapped(tensors)` asks the kernel to drop those
pages from this process (madvise MADV_DONTNEED), only where they belong to a file mapping: such a
page is read again from the page cache if anything touches it later, so nothing is lost even if a
part is still in use; heap memory is never touched. Linux only (elsewhere it does nothing).
`owned(t)` copies a tensor that lies in a file mapping into the process's own memory and gives the
mapped pages back: the offload store's memory tiers hold their weights so (a safetensors read is a view
of the file's pages, which a memory cgroup counts as reclaimable cache, evicts under its cap and reads
again from disk: the plan charged them as held).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys

import torch

_MADV_DONTNEED = 4  # Linux's value


@functools.lru_cache(maxsize=1)
def _madvise():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = libc.madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def file_mappings(maps_text: str) -> list[tuple[int, int]]:
    """The address ranges [start, end) of /proc/self/maps' lines that map a file (a path)."""
    ranges = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            start, end = (int(part, 16) for part in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def _maps() -> list[tuple[int, int]]:
    with open("/proc/self/maps") as f:
        return file_mappings(f.read())


def in_file_mapping(t: torch.Tensor, mapped: list[tuple[int, int]] | None = None) -> bool:
    """Whether any byte of CPU tensor `t`'s storage lies in a file mapping (False off Linux)."""
    if not sys.platform.startswith("linux") or t.device.type != "cpu" or t.is_mkldnn or not t.numel():
        return False
    storage = t.untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    return any(lo < end and start < hi for lo, hi in (_maps() if mapped is None else mapped))


def owned(t: torch.Tensor) -> torch.Tensor:
    """`t` in memory this process owns: a private copy where it lies in a file mapping (those pages
    given back, `release_mapped`), else `t` itself."""
    if not in_file_mapping(t):
        return t
    copy = t.clone(memory_format=torch.contiguous_format)
    release_mapped([t])
    return copy


def _tensors(weight) -> list[torch.Tensor]:
    """A weight's tensors: itself, or a compressed weight's parts (nested ones too)."""
    if isinstance(weight, torch.Tensor):
        return [weight]
    parts = [getattr(weight, name) for name in getattr(weight, "PARTS", ())]
    return [t for part in parts if part is not None for t in _tensors(part)]


def release_mapped(weights) -> int:
    """Drop from the resident set the whole pages under `weights` (tensors or compressed weights)
    that lie in a file mapping; returns the bytes given back (0 off Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    mapped = _maps()
    page, released = mmap.PAGESIZE, 0
    for t in (t for w in weights for t in _tensors(w)):
        if t.device.type != "cpu" or t.is_mkldnn or not t.numel() or not t.is_contiguous():
            continue
        start = -(-t.data_ptr() // page) * page  # whole pages inside the tensor only
        end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
        if end > start and any(lo <= start and end <= hi for lo, hi in mapped):
            if _madvise()(start, end - start, _MADV_DONTNEED) == 0:
                released += end - start
    return released


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


@functools.cache
def _libc_function(name: str, argtypes: tuple, restype):
    """A C library function, looked up once (find_library runs `ldconfig -p` in a subprocess: a call a
    decode sweep read ~42 KB through a pipe); None off Linux or where the library has none (musl, or
    glibc before 2.33 for mallinfo2)."""
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name, None)
    if fn is not None:
        fn.argtypes, fn.restype = list(argtypes), restype
    return fn


def _malloc_trim():
    return _libc_function("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)


def heap_free_bytes() -> int | None:
    """The bytes free inside glibc's heap (mallinfo2's fordblks, every arena): the most a
    `release_heap` could give back (pages it gave back stay counted, free but not resident). ~2 ms
    on a fragmented heap (it walks the free lists). None without glibc 2.33's mallinfo2."""
    info = _libc_function("mallinfo2", (), _MallInfo2)
    return None if info is None else int(info().fordblks)


def anon_resident_bytes() -> int | None:
    """The process's anonymous resident bytes (/proc/self/statm: resident less file-backed and shared
    pages, RssAnon): ~10 us where `heap_free_bytes` walks the free lists. None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return None
    return (int(fields[1]) - int(fields[2])) * mmap.PAGESIZE


def release_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's malloc_trim): after a load let go of
    its copies, the allocator kept ~0.75 GB of them (a llama-3.2-1b GGUF's first load: 1.58 -> 0.84 GB
    resident). Whether it ran (glibc on Linux only)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
