"""A GGUF file's header (metadata fields, tensor names and types) and the SHA-256 of its bytes,
parsed once and kept as JSON in the weight-cache folder.

Parsing a header with the `gguf` package walks every element of the tokenizer's arrays (SmolLM2:
49k tokens, 48k merges) and takes seconds; the JSON reads in a fraction of that. An entry is
found by the file's path, size, modification time and inode (like ccache's direct mode) and
holds the content hash the packed-weight cache is keyed by, so a warm load neither re-parses
nor re-hashes the file; an edited file gets a new entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexlamps.models.loading.errors import CheckpointError

FORMAT_VERSION = 1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFHeader:
    fields: dict[str, Any]  # metadata key -> value (str, number, bool or list)
    tensor_types: dict[str, str]  # tensor name -> GGML type name ("Q4_1", "F32", ...)
    sha256: str  # of the whole file


def open_gguf(path: Path):
    """The `gguf` package's reader of `path`, or a CheckpointError naming the file: "truncated" when
    the header or a tensor it lists lies past the file's end, else what the package said."""
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path} is empty: not a GGUF file; copy or download it again")
    try:
        return _end_checked_reader()(str(path))
    except _PastTheEnd as e:
        raise CheckpointError(f"{path} is truncated: it holds {size} bytes, but its header needs at least "
                              f"{e.args[0]}; copy or download it again") from None
    except Exception as e:  # noqa: BLE001  (the gguf package raises assorted errors on junk input)
        raise CheckpointError(f"{path} is not a readable GGUF file: {e}") from None


class _PastTheEnd(Exception):
    """A read the GGUF header asks for ends past the file's last byte (args: that end)."""


@functools.lru_cache(maxsize=1)
def _end_checked_reader():
    """The reader class, made on first use (the gguf package imports numpy)."""
    import gguf
    import numpy as np

    class Reader(gguf.GGUFReader):
        """The package's reader, its every read of the memory-mapped file checked to lie within it
        (numpy would hand back a shorter slice, and the package fail later on its shape)."""

        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise _PastTheEnd(end)
            return super()._get(offset, dtype, count, override_order)

    return Reader


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _entry(path: Path, cache_dir: Path) -> Path:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{FORMAT_VERSION}"
    return cache_dir / f"gguf-header-{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"


def read_header(path: Path, parse, cache_dir: Path | None) -> GGUFHeader:
    """The header of the GGUF at `path`: from the cache, else `parse()` -> (fields, tensor_types),
    hashed and cached. Without `cache_dir` nothing is cached."""
    entry = _entry(path, cache_dir) if cache_dir is not None else None
    if entry is not None and entry.exists():
        try:
            data = json.loads(entry.read_text())
            return GGUFHeader(data["fields"], data["tensor_types"], data["sha256"])
        except (OSError, ValueError, KeyError) as e:
            log.warning("GGUF header cache %s is unreadable (%s); parsing the file again", entry, e)
    fields, tensor_types = parse()
    header = GGUFHeader(fields, tensor_types, file_sha256(path))
    if entry is not None:
        _write_json(entry, {"fields": fields, "tensor_types": tensor_types, "sha256": header.sha256})
    return header


def _write_json(entry: Path, data: dict) -> None:
    try:
        text = json.dumps(data)
    except (TypeError, ValueError):  # a field json cannot hold: such files are parsed each time
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=entry.name, suffix=".tmp", dir=entry.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, entry)
    except OSError as e:
        log.warning("could not write the GGUF header cache %s (%s)", entry, e)
