"""`release_mapped`: a mapped weight's resident pages are given back and read again from the file
when touched; heap memory is left alone."""
import ctypes
import ctypes.util
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flexlamps.models.loading.mapped_pages import file_mappings, heap_free_bytes, in_file_mapping, owned, release_mapped
from quant.int4_weight import Int4Weight

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/maps: Linux")


def _resident_bytes(path) -> int:
    """This process's resident bytes of the mappings of file `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
                inside = len(fields) == 6 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_file_mappings_are_the_lines_with_a_path():
    text = ("7f00-7f10 r--s 00000000 08:01 12 /cache/w.safetensors\n"
            "7f10-7f20 rw-p 00000000 00:00 0 \n"
            "7f20-7f30 rw-p 00000000 00:00 0 [heap]\n")
    assert file_mappings(text) == [(0x7F00, 0x7F10)]


def test_a_mapped_weights_pages_are_given_back_and_read_again(tmp_path):
    path = tmp_path / "w.safetensors"
    dense = torch.randn(1024, 1024)
    w = Int4Weight.quantize(dense, 32, torch.bfloat16)
    save_file({"plain": dense, **w.to_tensors("w.")}, str(path))
    with safe_open(str(path), framework="pt") as f:
        plain = f.get_tensor("plain")
        mapped = Int4Weight.from_tensors({k: f.get_tensor(k) for k in f.keys() if k.startswith("w.")}, "w.")
    want = plain.clone()
    assert torch.equal(plain, dense)  # every page read
    mapped.dequantize()
    before = _resident_bytes(path)
    released = release_mapped([plain, mapped])
    after = _resident_bytes(path)
    assert released >= plain.nbytes - 2 * 4096 and before - after >= released - 4096, (before, after, released)
    assert torch.equal(plain, want) and torch.equal(mapped.dequantize(), w.dequantize())  # read again


def test_heap_memory_is_left_alone():
    t = torch.randn(1 << 20)
    want = t.clone()
    assert release_mapped([t]) == 0 and torch.equal(t, want)


def test_owned_copies_a_mapped_tensor_and_gives_its_pages_back(tmp_path):
    path = tmp_path / "w.safetensors"
    dense = torch.randn(1024, 1024)
    save_file({"plain": dense}, str(path))
    with safe_open(str(path), framework="pt") as f:
        plain = f.get_tensor("plain")
    assert in_file_mapping(plain) and torch.equal(plain, dense)
    before = _resident_bytes(path)
    copy = owned(plain)
    assert not in_file_mapping(copy) and torch.equal(copy, dense)
    assert before - _resident_bytes(path) >= plain.nbytes - 2 * 4096


def test_owned_leaves_heap_memory_as_it_is():
    t = torch.randn(1 << 16)
    assert not in_file_mapping(t) and owned(t) is t


@pytest.mark.skipif(heap_free_bytes() is None, reason="glibc's mallinfo2 only")
def test_heap_free_bytes_counts_what_the_heap_freed():
    """`heap_free_bytes` (the sweep's trims ask it) reads glibc's own count: 16 blocks of 64 KiB freed
    (under the mmap threshold, so in the heap) add at least 15 of them to it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 << 10) for _ in range(16)]
    held = heap_free_bytes()
    for b in blocks:
        libc.free(b)
    assert heap_free_bytes() >= held + 15 * (64 << 10)
