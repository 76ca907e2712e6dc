"""Folders a run writes: made (with parents) and checked writable, the refusal naming the option."""

from __future__ import annotations

import os
from pathlib import Path


class UnusablePathError(OSError):
    """A folder cannot be made or written; the message names the option and the fix."""


def make_writable_folder(folder: str | Path, option: str, shown: str | Path | None = None) -> Path:
    """Create `folder` and its parents and check it is writable.

    Args:
        folder: the folder to make.
        option: the option that named it (e.g. "--out"), for the message.
        shown: the path as the user gave it (default: `folder`).
    """
    folder, shown = Path(folder), shown if shown is not None else folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UnusablePathError(f"{option} {shown}: cannot create {folder} ({e.strerror}); "
                                f"choose another {option}") from None
    if not os.access(folder, os.W_OK):
        raise UnusablePathError(f"{option} {shown}: {folder} is not writable; choose another {option}")
    return folder
