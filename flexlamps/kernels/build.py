"""Compiling a kernel: the CPU's flags, and a build keyed by source, compiler and flags into a
cache folder.

`built_library(source, flags, folder)` compiles `source` with the system C compiler (`$CC`, else
cc) into `folder` once per source (and the headers beside it that it includes, nested ones too),
compiler version and flags, under a file lock, into a temporary file renamed into place:
concurrent processes neither race nor see half a file. Imports nothing of torch.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

SOURCES = Path(__file__).resolve().parent  # every kernel's C source and header


class NoCompiler(OSError):
    """No C compiler was found ($CC, else cc)."""


def cpu_has_flags(flags: tuple[str, ...], cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU reports every one of `flags` (Linux's /proc/cpuinfo names)."""
    have = cpu_flags(cpuinfo)
    return all(flag in have for flag in flags)


def compiler() -> str:
    found = shutil.which(os.environ.get("CC") or "cc")
    if found is None:
        raise NoCompiler("no C compiler found (set $CC)")
    return found


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', flags=re.M)


def _header(name: str, beside: Path) -> Path:
    """Where the compiler finds `#include "name"` written in a file of folder `beside`: there.
    Raises FileNotFoundError naming it (a wheel that left a header out)."""
    if not (beside / name).is_file():
        raise FileNotFoundError(f'#include "{name}" is not in {beside}')
    return beside / name


def _texts(source: Path) -> list[str]:
    """The source and every local header it includes (`#include "name.h"`, beside the file that
    includes it), nested includes too: a change to any of them makes another
    library."""
    texts, seen, todo = [], set(), [source.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        text = path.read_text()
        texts.append(text if path == source.resolve() else f"{path.name}\0{text}")
        todo += [_header(name, path.parent).resolve() for name in _INCLUDE.findall(text)]
    return texts


def library_path(source: Path, flags: tuple[str, ...], folder: Path) -> Path:
    """Where `source` built with `flags` by this compiler lies in `folder` (built or not). Raises
    NoCompiler."""
    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([*_texts(source), version, *flags]).encode()).hexdigest()[:16]
    return folder / f"{source.stem}-{key}.so"


def built_library(source: Path, flags: tuple[str, ...], folder: Path) -> ctypes.CDLL:
    """`source` compiled with `flags` into `folder` unless already there, and loaded. Raises
    NoCompiler, subprocess.CalledProcessError (its stderr says why) or OSError."""
    cc, target = compiler(), library_path(source, flags, folder)
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / f"{source.stem}.lock")):
            if not target.exists():
                fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
                os.close(fd)
                try:
                    subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True,
                                   text=True, check=True)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    return ctypes.CDLL(str(target))


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Every flag this CPU reports (Linux's /proc/cpuinfo names; none where it cannot be read)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    return next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
