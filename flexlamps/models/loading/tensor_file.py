"""Write a safetensors file one tensor at a time, so writing a model's weights holds one matrix,
not all of them (`safetensors.torch.save_file` takes them all at once and copies each to bytes
first: the weight cache's cold load peaked at 1000 MiB for SmolLM2's 270 MiB of dense copies).

The layout is safetensors' own: an 8-byte little-endian header length, the JSON header (dtype,
shape and byte range of every tensor, padded with spaces to 8 bytes), then the tensors' bytes
back to back (widest dtypes first, then by name, as safetensors orders them: every tensor stays
aligned for its dtype), in the machine's byte order (little-endian on x86 and ARM, as the format
wants). safetensors' reader checks all of it on open. The file is written to a temp name beside
`path` and renamed, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import math
import os
import struct
import tempfile
from pathlib import Path
from typing import Callable

import torch

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32",
                      torch.uint8: "U8", torch.int8: "I8", torch.int64: "I64", torch.float8_e4m3fn: "F8_E4M3"}


def write_tensors(path: Path, layout: dict[str, tuple[tuple[int, ...], torch.dtype]],
                  tensor: Callable[[str], torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write the file at `path`: `layout` gives each tensor's shape and dtype in file order, and
    `tensor(name)` makes it when its turn comes (it is written and dropped before the next)."""
    layout = {name: layout[name] for name in sorted(layout, key=lambda n: (-layout[n][1].itemsize, n))}
    header: dict = {"__metadata__": dict(metadata or {})}
    offset = 0
    for name, (shape, dtype) in layout.items():
        size = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for name, (shape, dtype) in layout.items():
                f.write(_tensor_bytes(name, tensor(name), shape, dtype))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _tensor_bytes(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> memoryview:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"tensor {name} is {t.dtype} {tuple(t.shape)}, the file's header says {dtype} {tuple(shape)}")
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
