"""C kernels compiled on first use: the CPU's flags, a build keyed by source, compiler and flags
into a cache folder, and the loaded library.

`built_library(source, flags, folder)` compiles `source` with the system C compiler (`$CC`, else
cc) into `folder` once per source (and the local headers it includes), compiler version and flags, under a file lock, into a
temporary file renamed into place: concurrent processes neither race nor see half a file.
Imports nothing of torch.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Callable, TypeVar

from filelock import FileLock

T = TypeVar("T")


class NoCompiler(OSError):
    """No C compiler was found ($CC, else cc)."""


def cpu_has_flags(flags: tuple[str, ...], cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU reports every one of `flags` (Linux's /proc/cpuinfo names)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    have = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return all(flag in have for flag in flags)


def compiler() -> str:
    found = shutil.which(os.environ.get("CC") or "cc")
    if found is None:
        raise NoCompiler("no C compiler found (set $CC)")
    return found


def _texts(source: Path) -> list[str]:
    """The source and the local headers it includes (`#include "name.h"`, beside it): a change to
    any of them makes another library."""
    text = source.read_text()
    headers = re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, flags=re.M)
    return [text, *(f"{name}\0{(source.parent / name).read_text()}" for name in headers)]


def built_library(source: Path, flags: tuple[str, ...], folder: Path) -> ctypes.CDLL:
    """`source` compiled with `flags` into `folder` unless already there, and loaded. Raises
    NoCompiler, subprocess.CalledProcessError (its stderr says why) or OSError."""
    cc = compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([*_texts(source), version, *flags]).encode()).hexdigest()[:16]
    target = folder / f"{source.stem}-{key}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / f"{source.stem}.lock")):
            if not target.exists():
                fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
                os.close(fd)
                try:
                    subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True, check=True)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    return ctypes.CDLL(str(target))


def load_checked(source: Path, flags: tuple[str, ...], folder: Path, make: Callable[[ctypes.CDLL], T], what: str,
                 fallback: str) -> T | None:
    """`make(library)` (which wraps the built library and checks it, raising AssertionError if a
    result is wrong), or None with a RuntimeWarning naming `what` is not used and why, and what
    runs instead (`fallback`): no compiler, a failed build, a library that does not load or check."""
    try:
        return make(built_library(source, flags, folder))
    except NoCompiler:
        warnings.warn(f"flexlamps: no C compiler found (set $CC), so {fallback}", RuntimeWarning, stacklevel=3)
    except (OSError, subprocess.CalledProcessError, AssertionError) as err:
        detail = getattr(err, "stderr", None) or err
        warnings.warn(f"flexlamps: {what} is not used ({str(detail).strip()[-500:]}); {fallback}", RuntimeWarning,
                      stacklevel=3)
    return None
