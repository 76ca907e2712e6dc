"""An exclusive lock on a file or folder a run writes, with the holder named in the refusal.

The lock is `filelock`'s (an OS file lock on `<path>.lock`), so the kernel drops it when the
holder dies: a lock left by a killed run is taken over by the next one without any check of
ours. Beside it `<path>.lock.owner` names the holder (pid, host, command, start time) so a
second run can say who is using the path. Both files are removed on release. Imports only the stdlib and filelock (no torch).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import filelock

from offload.folders import UnusablePathError, make_writable_folder


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
        self._lock = _file_lock(self.lock_path)

    def acquire(self) -> PathLock:
        make_writable_folder(self.lock_path.parent, self.option, self.shown)
        try:
            self._acquire_current()
        except (filelock.Timeout, _Replaced):
            if self.lock_path.exists() and not os.access(self.lock_path, os.W_OK):  # not a holder: a lock we cannot open
                raise UnusablePathError(f"{self.option} {self.shown}: cannot open {self.lock_path} (permission "
                                        f"denied); remove it or choose another {self.option}") from None
            raise PathInUseError(f"{self.option} {self.shown} is in use by {self._holder()}; wait for that run "
                                 f"to finish or choose another {self.option}") from None
        except OSError as e:
            raise UnusablePathError(f"{self.option} {self.shown}: cannot create {self.lock_path} ({e.strerror}); "
                                    f"choose another {self.option}") from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "command": " ".join(sys.argv)[:300]}
        tmp = self.owner_path.with_name(f"{self.owner_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(owner))
        os.replace(tmp, self.owner_path)
        return self

    def _acquire_current(self, tries: int = 3) -> None:
        """Lock the current lock file: a file just unlinked by its releasing holder is tried again."""
        for attempt in range(tries):
            try:
                self._lock.acquire()
                return
            except _Replaced:
                if attempt == tries - 1:
                    raise

    def _holder(self) -> str:
        try:
            o = json.loads(self.owner_path.read_text())
            return f"process {o['pid']} on {o['host']} (started {o['started']}: {o['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def release(self) -> None:
        """Let the path go and remove the lock files (unlinked while held: a run that opened the old
        file meanwhile finds it replaced, see `_file_lock`)."""
        if self._lock.is_locked:
            self.owner_path.unlink(missing_ok=True)
            self.lock_path.unlink(missing_ok=True)
            self._lock.release()

    def __enter__(self) -> PathLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class _Replaced(RuntimeError):
    """The lock file was unlinked by its last holder between our open and our lock."""


def _file_lock(path: Path) -> filelock.FileLock:
    """A non-blocking OS lock on `path` that refuses a file its last holder unlinked on release:
    holding that orphan would let a second run lock the new file beside us."""
    def check_current(fd: int) -> None:
        try:
            current = os.stat(path)
        except FileNotFoundError:
            raise _Replaced(str(path)) from None
        if not os.path.samestat(os.fstat(fd), current):
            raise _Replaced(str(path))

    try:
        return filelock.FileLock(str(path), timeout=0, on_acquired=check_current)
    except TypeError:  # filelock < 3.30 has no on_acquired; the window is one open-to-flock race
        return filelock.FileLock(str(path), timeout=0)
