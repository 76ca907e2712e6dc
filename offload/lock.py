"""An exclusive lock on a file or folder a run writes, with the holder named in the refusal.

The lock is `filelock`'s (an OS file lock on `<path>.lock`), so the kernel drops it when the
holder dies: a lock left by a killed run is taken over by the next one without any check of
ours. Beside it `<path>.lock.owner` names the holder (pid, host, command, start time) so a
second run can say who is using the path. Imports only the stdlib and filelock (no torch).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import filelock


class PathInUseError(RuntimeError):
    """Another live process holds the lock; the message names it and the fix."""


class PathLock:
    """`with PathLock(out_path, "--out"):` holds a path for this process or raises `PathInUseError`.

    Args:
        base: the lock files are `<base>.lock` and `<base>.lock.owner`.
        option: the option that named the path (e.g. "--out"), for the message.
        shown: the path as the user gave it (default: `base`).
    """

    def __init__(self, base: str | Path, option: str, shown: str | Path | None = None):
        self.lock_path = Path(f"{base}.lock")
        self.owner_path = Path(f"{base}.lock.owner")
        self.option, self.shown = option, shown if shown is not None else base
        self._lock = filelock.FileLock(str(self.lock_path), timeout=0)

    def acquire(self) -> PathLock:
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except filelock.Timeout:
            raise PathInUseError(f"{self.option} {self.shown} is in use by {self._holder()}; wait for that run "
                                 f"to finish or choose another {self.option}") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "command": " ".join(sys.argv)[:300]}
        tmp = self.owner_path.with_name(f"{self.owner_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(owner))
        os.replace(tmp, self.owner_path)
        return self

    def _holder(self) -> str:
        try:
            o = json.loads(self.owner_path.read_text())
            return f"process {o['pid']} on {o['host']} (started {o['started']}: {o['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def release(self) -> None:
        if self._lock.is_locked:
            self.owner_path.unlink(missing_ok=True)
            self._lock.release()

    def __enter__(self) -> PathLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
