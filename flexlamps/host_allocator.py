"""Keep freed activation memory in the process instead of handing it back to the kernel.

glibc serves large allocations with fresh `mmap`s and returns them on free, so every
activation of a few MiB (a prefill's q, gate, up: 10-25 MiB each at batch 32) is paged in
again, zero-filled, one 4 KiB fault at a time: on a virtual machine that cost 3-4x the
arithmetic of the elementwise ops and stretched GEMMs too. Raising the mmap threshold to its
ceiling and disabling trimming lets the heap reuse those pages; this is what tcmalloc or
jemalloc (recommended by PyTorch's CPU tuning guide) do by design. Peak RSS grows little,
as the pages are reused for the next step's activations (SmolLM2, 32 prompts, 32 new tokens:
1738 -> 1806 MiB, 77 -> 85 tok/s). Allocations above 32 MiB (weight buffers, caches) still go
back to the system. One arena serves every thread: the offload store reads weights on worker
threads, and with an arena per thread each kept its own freed buffers (SmolLM2 offloaded to
256 + 256 MiB, float32: peak RSS 969 -> 928 MiB at the same speed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
_TRIM_NEVER = 2**31 - 1

_done = False
# primitives oneDNN keeps built (its default: 1024, each with its JIT code); see bound_onednn_cache
ONEDNN_PRIMITIVES = "64"


def keep_freed_memory() -> bool:
    """Tune glibc's allocator as described above, once per process; False where it does not apply.

    Set FLEXLAMPS_KEEP_FREED_MEMORY=0 to leave the allocator as it is.
    """
    global _done
    bound_onednn_cache()
    if _done:
        return True
    if os.environ.get("FLEXLAMPS_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    _done = all(mallopt(param, value) for param, value in (
        (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX), (_M_TRIM_THRESHOLD, _TRIM_NEVER), (_M_ARENA_MAX, 1)))
    return _done


def bound_onednn_cache() -> None:
    """Keep oneDNN's primitive cache small: a prompt's routed experts each see their own token count,
    so a MoE prompt sweep builds a primitive per (expert, count), and at the default capacity they stay,
    uncharged (the MoE job's worker, 16 prompts of 128 tokens, 4 layers: ~170 MiB of its resident set).
    A decode step's few shapes stay cached. Read when oneDNN builds its first primitive; a user's
    ONEDNN_PRIMITIVE_CACHE_CAPACITY stands."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_PRIMITIVES)
