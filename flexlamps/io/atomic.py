"""Output files written whole or not at all: a temporary name beside the target, then a rename.

The temporary file is made with `os.open(..., 0o666)`, so the output's permissions follow the
user's umask as a plain `open` would (`tempfile.mkstemp` would make every output 0600).
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path


def temp_beside(path: str | Path) -> Path:
    """A fresh hidden name in `path`'s folder, `.<name>.<pid>.<random>.tmp` (what cleanups look for)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextmanager
def atomic_output(path: str | Path, mode: str = "w", fsync: bool = False):
    """`with atomic_output(p) as f:` writes `p` through a temporary file renamed over it on success;
    on any failure the temporary file is removed and `p` is left as it was."""
    tmp = temp_beside(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
