"""The disk tier: one raw file per tensor plus `index.json`, in Accelerate's offload-folder layout,
inside a subfolder `flexlamps-offload/` that flexlamps creates, marks and locks in the folder the
user names: files beside it are never touched, and only files the index lists are deleted.

`index.json` maps each name to its dtype and shape (what Accelerate writes); we add, under a
`"__flexlamps__"` key, the owner fingerprint (model and placement) and a CRC32 and size per
file, so a damaged or stale folder is detected and rebuilt instead of silently used.
Reads go into a caller-given buffer with `O_DIRECT` where the buffer, the offset and the length
are block-aligned (`aligned_empty` makes such buffers): the disk DMAs into the buffer, with no
page-cache copy (about a tenth of the CPU time of a buffered read, which the compute shares the
cores with) and nothing left in RAM. Else (or on a file system without `O_DIRECT`) `os.pread`,
then those pages dropped from the page cache (`posix_fadvise(DONTNEED)`), so a benchmark measures
the disk, not RAM, either way.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from pathlib import Path

import torch

from offload.folders import make_writable_folder
from offload.lock import PathLock

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64}
_META_KEY = "__flexlamps__"
_CRC_CHUNK = 1 << 24
DIRECT_ALIGN = 4096  # O_DIRECT's alignment of buffer, offset and length (a page: every block size)


def aligned_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An empty CPU tensor whose data starts on a `DIRECT_ALIGN` boundary (a direct read's buffer)."""
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(nbytes + DIRECT_ALIGN, dtype=torch.uint8)
    start = -raw.data_ptr() % DIRECT_ALIGN
    return raw[start:start + nbytes].view(dtype).view(shape)


class StaleOffloadFolderError(RuntimeError):
    pass


class OffloadFolderError(OSError):
    """The offload folder cannot be used; the message names the folder, what was found and the fix."""


SUBFOLDER = "flexlamps-offload"  # what we own inside the folder the user named
_MARK = ".flexlamps-offload"     # the mark file in it that says so


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _file_name(name: str) -> str:
    return name.replace("/", "_") + ".dat"


class DiskFolder:
    """Tensors of one run in `<folder>/flexlamps-offload/`, a subfolder flexlamps creates and
    marks. Nothing outside it is written; inside it, only files its index lists are deleted.
    `claim()` locks it for this process (a second run is refused, naming the holder)."""

    def __init__(self, folder: str | Path, fingerprint: str):
        self.root = Path(folder)
        self.folder = self.root / SUBFOLDER
        self.fingerprint = fingerprint
        self.index: dict[str, dict] = {}
        self._files: dict[str, dict] = {}
        self._lock = None
        self.direct = hasattr(os, "O_DIRECT")  # False once the file system refuses it
        self.reads = {"direct": 0, "buffered": 0}

    # -- ownership ----------------------------------------------------------------------------
    def claim(self) -> None:
        """Create (or recognise) our subfolder and lock it for this process."""
        make_writable_folder(self.folder, "--offload-dir", shown=self.root)
        mark = self.folder / _MARK
        if not mark.exists():
            found = sorted(p.name for p in self.folder.iterdir())
            if found:
                raise OffloadFolderError(
                    f"--offload-dir {self.root}: {self.folder} exists and holds files flexlamps did not make "
                    f"({', '.join(found[:5])}{' ...' if len(found) > 5 else ''}); move them or choose another "
                    "--offload-dir")
            mark.write_text("made by flexlamps: it deletes only the files listed in index.json here\n")
        self._lock = PathLock(self.folder / ".flexlamps", "--offload-dir", shown=self.root).acquire()

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- checks before anything is written ------------------------------------------------
    def check_room(self, needed_bytes: int, reused: bool) -> None:
        """Raise when the disk cannot hold `needed_bytes` beside what stays; a reused folder
        needs nothing more, a rebuilt one gets back the space of the files it replaces."""
        if reused:
            return
        freed = sum(f.get("size", 0) for f in self._listed_files().values())
        free = shutil.disk_usage(self.folder).free
        if needed_bytes - freed > free:
            raise OffloadFolderError(f"--offload-dir {self.root} has {free / 2**30:.2f} GiB free but the policy puts "
                                     f"{needed_bytes / 2**30:.2f} GiB there; free space, choose another "
                                     "--offload-dir or raise --cpu-mem so less goes to disk")

    # -- reuse ------------------------------------------------------------------------------
    def _read_index(self) -> dict | None:
        try:
            index = json.loads((self.folder / "index.json").read_text())
        except (OSError, ValueError):
            return None
        return index if isinstance(index, dict) and isinstance(index.get(_META_KEY), dict) else None

    def _listed_files(self) -> dict[str, dict]:
        index = self._read_index()
        files = index[_META_KEY].get("files") if index else None
        return files if isinstance(files, dict) else {}

    def try_reuse(self, expected: set[str], verify: bool = True) -> bool:
        """True when the folder already holds exactly the tensors `expected`, written for our
        fingerprint (which names the model and the placement), with intact files."""
        index = self._read_index()
        if index is None:
            return False
        meta = index.pop(_META_KEY)
        if not meta.get("complete") or meta.get("fingerprint") != self.fingerprint or set(index) != set(expected):
            return False
        for name in expected:
            f = meta["files"].get(name)
            file = self.folder / _file_name(name)
            if f is None or not file.exists() or file.stat().st_size != f["size"]:
                return False
            if verify and _crc32(file) != f["crc32"]:
                return False
        self.index, self._files = index, meta["files"]
        return True

    def clear(self) -> None:
        """Delete the files our index lists (and their temp files), then the index."""
        for name in self._listed_files():
            file = self.folder / _file_name(name)
            file.unlink(missing_ok=True)
            file.with_suffix(".tmp").unlink(missing_ok=True)
        (self.folder / "index.json").unlink(missing_ok=True)
        self.index, self._files = {}, {}

    def begin(self, names: set[str]) -> None:
        """List the files about to be written before writing any: a run killed midway leaves
        an index (marked incomplete) that lets the next run delete exactly them."""
        self._write_index({}, {n: {} for n in names}, complete=False)

    # -- writes -----------------------------------------------------------------------------
    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write one tensor through a temp file and a rename; a full disk names the folder."""
        data = tensor.detach().contiguous().cpu()
        raw = memoryview(data.view(torch.uint8).numpy()).cast("B") if data.numel() else memoryview(b"")
        file = self.folder / _file_name(name)
        tmp = file.with_suffix(".tmp")
        try:
            _write_all(tmp, raw)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno == errno.ENOSPC:
                raise OffloadFolderError(f"--offload-dir {self.root}: the disk filled up while writing {name}; "
                                         "free space, choose another --offload-dir or raise --cpu-mem") from None
            raise OffloadFolderError(f"--offload-dir {self.root}: cannot write {file.name}: {e.strerror}") from None
        os.replace(tmp, file)
        self.index[name] = {"dtype": _dtype_name(data.dtype), "shape": list(data.shape)}
        self._files[name] = {"size": len(raw), "crc32": zlib.crc32(raw)}

    def commit(self) -> None:
        """Mark the index complete, last: a folder killed mid-write is never reused."""
        self._write_index(self.index, self._files, complete=True)

    def _write_index(self, index: dict, files: dict, complete: bool) -> None:
        body = dict(index)
        body[_META_KEY] = {"fingerprint": self.fingerprint, "files": files, "complete": complete}
        tmp = self.folder / "index.json.tmp"
        with open(tmp, "w") as fh:
            fh.write(json.dumps(body))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.folder / "index.json")

    # -- reads ------------------------------------------------------------------------------
    def nbytes(self, name: str) -> int:
        return self._files[name]["size"]

    def read_into(self, name: str, out: torch.Tensor) -> torch.Tensor:
        """Read `name` into `out` (a contiguous CPU tensor of the right shape and dtype)."""
        entry = self.index[name]
        if list(out.shape) != entry["shape"] or _dtype_name(out.dtype) != entry["dtype"]:
            raise ValueError(f"buffer {tuple(out.shape)} {out.dtype} does not fit {name} {entry}")
        return self._pread(name, 0, out)

    def read_rows_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor:
        """Read rows start .. start + len(out) of a tensor (along dim 0) into `out`."""
        entry = self.index[name]
        if list(out.shape[1:]) != entry["shape"][1:] or start + len(out) > entry["shape"][0]:
            raise ValueError(f"rows {start}..{start + len(out)} {tuple(out.shape)} do not fit {name} {entry}")
        row_bytes = out[0].numel() * out.element_size() if len(out) else 0
        return self._pread(name, start * row_bytes, out)

    def _pread(self, name: str, offset: int, out: torch.Tensor) -> torch.Tensor:
        """Fill `out` from the file at `offset`: a direct read where everything is aligned, else a
        buffered one whose pages are then dropped from the page cache."""
        view = memoryview(out.view(torch.uint8).numpy()).cast("B") if out.numel() else memoryview(b"")
        path = self.folder / _file_name(name)
        aligned = not (offset % DIRECT_ALIGN or len(view) % DIRECT_ALIGN or out.data_ptr() % DIRECT_ALIGN)
        if self.direct and aligned and len(view) and self._direct_read(path, name, offset, view):
            self.reads["direct"] += 1
            return out
        fd = os.open(path, os.O_RDONLY)
        try:
            self._fill(fd, name, offset, view)
            os.posix_fadvise(fd, offset, len(view), os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        self.reads["buffered"] += 1
        return out

    def _direct_read(self, path: Path, name: str, offset: int, view: memoryview) -> bool:
        """Fill `view` with O_DIRECT; False (and no more tries) where the file system refuses it."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.direct = False
            return False
        try:
            self._fill(fd, name, offset, view)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.direct = False  # an alignment this device does not take: buffered from now on
            return False
        finally:
            os.close(fd)
        return True

    def _fill(self, fd: int, name: str, offset: int, view: memoryview) -> None:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                raise StaleOffloadFolderError(f"{self.folder}: {name} is truncated; delete the folder to rebuild it")
            done += n

    def spec(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        e = self.index[name]
        return tuple(e["shape"]), _DTYPES[e["dtype"]]


def _write_all(path: Path, raw: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < len(raw):
            done += os.write(fd, raw[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
