"""The disk tier: one raw file per tensor plus `index.json`, in Accelerate's offload-folder layout.

`index.json` maps each name to its dtype and shape (what Accelerate writes); we add, under a
`"__flexlamps__"` key, the owner fingerprint (model and placement) and a CRC32 and size per
file, so a damaged or stale folder is detected and rebuilt instead of silently used.
Reads use `os.pread` into a caller-given buffer, then drop those pages from the page cache
(`posix_fadvise(DONTNEED)`) so a benchmark measures the disk, not RAM.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64}
_META_KEY = "__flexlamps__"
_CRC_CHUNK = 1 << 24


class StaleOffloadFolderError(RuntimeError):
    pass


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _file_name(name: str) -> str:
    return name.replace("/", "_") + ".dat"


class DiskFolder:
    def __init__(self, folder: str | Path, fingerprint: str):
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.index: dict[str, dict] = {}
        self._files: dict[str, dict] = {}

    # -- checks before anything is written ------------------------------------------------
    def check_writable(self, needed_bytes: int) -> None:
        """Raise with a clear message if the folder cannot be created or lacks room."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"offload folder {self.folder} cannot be created: {e.strerror}; choose another --offload-dir") from None
        if not os.access(self.folder, os.W_OK):
            raise OSError(f"offload folder {self.folder} is not writable; choose another --offload-dir")
        reusable = sum(f["size"] for f in self._files.values())
        free = shutil.disk_usage(self.folder).free
        if needed_bytes - reusable > free:
            raise OSError(f"offload folder {self.folder} has {free / 2**30:.2f} GiB free but the policy puts "
                          f"{needed_bytes / 2**30:.2f} GiB there; free space or lower the disk share")

    # -- reuse ------------------------------------------------------------------------------
    def try_reuse(self, expected: set[str], verify: bool = True) -> bool:
        """True when the folder already holds exactly the tensors `expected`, written for our
        fingerprint (which names the model and the placement), with intact files."""
        path = self.folder / "index.json"
        if not path.exists():
            return False
        try:
            index = json.loads(path.read_text())
            meta = index.pop(_META_KEY)
        except (json.JSONDecodeError, KeyError, AttributeError):
            return False
        if meta.get("fingerprint") != self.fingerprint or set(index) != set(expected):
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
        if self.folder.exists():
            for p in self.folder.glob("*.dat"):
                p.unlink()
            (self.folder / "index.json").unlink(missing_ok=True)
        self.index, self._files = {}, {}

    # -- writes -----------------------------------------------------------------------------
    def write(self, name: str, tensor: torch.Tensor) -> None:
        data = tensor.detach().contiguous().cpu()
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
        file = self.folder / _file_name(name)
        tmp = file.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, file)
        self.index[name] = {"dtype": _dtype_name(data.dtype), "shape": list(data.shape)}
        self._files[name] = {"size": len(raw), "crc32": zlib.crc32(raw)}

    def commit(self) -> None:
        """Write index.json last: a folder without it (a crash mid-write) is never reused."""
        body = dict(self.index)
        body[_META_KEY] = {"fingerprint": self.fingerprint, "files": self._files}
        tmp = self.folder / "index.json.tmp"
        tmp.write_text(json.dumps(body))
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
        """Fill `out` from the file at `offset`, then drop those pages from the page cache."""
        view = memoryview(out.view(torch.uint8).numpy()).cast("B") if out.numel() else memoryview(b"")
        fd = os.open(self.folder / _file_name(name), os.O_RDONLY)
        try:
            done = 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], offset + done)
                if n <= 0:
                    raise StaleOffloadFolderError(f"{self.folder}: {name} is truncated; delete the folder to rebuild it")
                done += n
            os.posix_fadvise(fd, offset, len(view), os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return out

    def spec(self, name: str) -> tuple[tuple[int, ...], torch.dtype]:
        e = self.index[name]
        return tuple(e["shape"]), _DTYPES[e["dtype"]]


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
