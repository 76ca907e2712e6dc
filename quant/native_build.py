"""C kernels compiled on first use: the CPU's flags, a build keyed by source, compiler and flags
into a cache folder, and the loaded library.

`built_library(source, flags, folder)` compiles `source` with the system C compiler (`$CC`, else
cc) into `folder` once per source (and the local headers it includes, nested ones too), compiler version and flags, under a file lock, into a
temporary file renamed into place: concurrent processes neither race nor see half a file.
`load_checked(library, folder, make, check)` is what each kernel module's `load` runs: it
honours $FLEXLAMPS_NATIVE_KERNELS=0 and the CPU's flags, builds, wraps and checks the library,
and warns, answering None, where that fails. Imports nothing of torch.
"""
from __future__ import annotations

import ctypes
import dataclasses
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
SWITCH_ENV = "FLEXLAMPS_NATIVE_KERNELS"  # "0": every library here is left unused


@dataclasses.dataclass(frozen=True)
class Library:
    """A C kernel library: its source, how it is compiled, what the CPU must have, and for a
    warning what it is and what runs without it."""
    source: Path
    compile_flags: tuple[str, ...]
    cpu_flags: tuple[str, ...]
    what: str
    fallback: str


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


# Where a kernel's `#include "name.h"` is found when it is not beside the source: quant's own
# headers (native_halves.h), which the kernels of flexlamps/models share; passed to the compiler as -I.
INCLUDE_DIR = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', flags=re.M)


def _header(name: str, beside: Path) -> Path:
    """Where the compiler finds `#include "name"` written in a file of folder `beside`: there, else
    in INCLUDE_DIR (the -I). Raises FileNotFoundError naming both."""
    for folder in (beside, INCLUDE_DIR):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f'#include "{name}" is neither in {beside} nor in {INCLUDE_DIR}')


def _texts(source: Path) -> list[str]:
    """The source and every local header it includes (`#include "name.h"`, beside the file that
    includes it or in INCLUDE_DIR), nested includes too: a change to any of them makes another
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
                    subprocess.run([cc, *flags, f"-I{INCLUDE_DIR}", str(source), "-o", tmp], capture_output=True,
                                   text=True, check=True)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    return ctypes.CDLL(str(target))


def switched_off() -> bool:
    """Whether $FLEXLAMPS_NATIVE_KERNELS=0 asks for torch's ops only (A/B runs, a broken toolchain)."""
    return os.environ.get(SWITCH_ENV, "1").strip() == "0"


def load_checked(library: Library, folder: Path, make: Callable[[ctypes.CDLL], T],
                 check: Callable[[T], None]) -> T | None:
    """`make(the built library)`, once `check` (which raises AssertionError on a wrong result)
    passed on it; None where the switch is off or the CPU lacks `library.cpu_flags`, and None with
    a RuntimeWarning naming what is not used, why and what runs instead where no compiler is
    found, the build fails, or the library does not load or check."""
    if switched_off() or not cpu_has_flags(library.cpu_flags):
        return None
    try:
        kernel = make(built_library(library.source, library.compile_flags, folder))
        check(kernel)
        return kernel
    except NoCompiler:
        warnings.warn(f"flexlamps: no C compiler found (set $CC), so {library.fallback}", RuntimeWarning, stacklevel=3)
    except (OSError, subprocess.CalledProcessError, AssertionError) as err:
        detail = getattr(err, "stderr", None) or err
        warnings.warn(f"flexlamps: {library.what} is not used ({str(detail).strip()[-500:]}); {library.fallback}",
                      RuntimeWarning, stacklevel=3)
    return None
