"""Folders a run writes: made (with parents) and checked writable, the refusal naming the option."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class UnusablePathError(OSError):
    """A folder cannot be made or written; the message names the option and the fix."""


def make_writable_folder(folder: str | Path, option: str, shown: str | Path | None = None) -> Path:
    """Create `folder` and its parents and check a file can be written in it.

    Args:
        folder: the folder to make.
        option: the option that named it (e.g. "--out"), for the message.
        shown: the path as the user gave it (default: `folder`).
    """
    folder, shown = Path(folder), shown if shown is not None else folder
    blocker = _file_in_the_way(folder)
    if blocker is not None:
        raise UnusablePathError(f"{option} {shown}: {blocker} is a file, not a folder; choose another {option}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UnusablePathError(f"{option} {shown}: cannot create {folder} ({e.strerror}); "
                                f"choose another {option}") from None
    try:  # a real write: os.access says yes to root on a read-only mount or under /sys
        with tempfile.TemporaryFile(dir=folder, prefix=".flexlamps-probe-"):
            pass
    except OSError as e:
        raise UnusablePathError(f"{option} {shown}: cannot write in {folder} ({e.strerror}); "
                                f"choose another {option}") from None
    return folder


def _file_in_the_way(folder: Path) -> Path | None:
    """The nearest existing path at or above `folder` when it is not a folder (then no folder can be made)."""
    for path in (folder, *folder.parents):
        if os.path.lexists(path):
            return None if path.is_dir() else path
    return None
