"""Resumable JSONL results.

Finished records are appended to `<out>.partial`, flushed and fsynced one by one, so a crash
or Ctrl-C loses nothing that was reported finished. A re-run reads them back (dropping a torn
last line) and skips those ids. When every prompt is done, the records are written in input
order to a temp file that is renamed to `<out>`: the final file is never half-written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class ResultsError(ValueError):
    pass


class ResumableResults:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.done: dict[str, dict[str, Any]] = {}
        self._fh = None

    def load(self) -> dict[str, dict[str, Any]]:
        """Read records finished by earlier runs (from the final file and the partial one)."""
        for path in (self.out, self.partial):
            if path.exists():
                self._read(path, truncate_torn=path == self.partial)
        return self.done

    def _read(self, path: Path, truncate_torn: bool) -> None:
        data = path.read_bytes()
        good = 0
        for line in data.splitlines(keepends=True):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if not line.endswith(b"\n") and truncate_torn:
                    break  # the torn tail of a killed run: drop it
                raise ResultsError(f"{path} holds a malformed line; delete it to start over") from None
            if not line.endswith(b"\n") and truncate_torn:
                break
            good += len(line)
            self.done.setdefault(str(rec["id"]), rec)
        if truncate_torn and good < len(data):
            with open(path, "r+b") as fh:
                fh.truncate(good)

    def open(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(self.out.parent, os.W_OK):
            raise ResultsError(f"cannot write to {self.out.parent}; choose another --out")
        existing = set()
        if self.partial.exists():
            existing = {str(json.loads(ln)["id"]) for ln in self.partial.read_text().splitlines() if ln.strip()}
        self._fh = open(self.partial, "a", encoding="utf-8")
        # records only in the final file (a finished earlier run) are carried into the partial one
        for rid, rec in self.done.items():
            if rid not in existing:
                self._write(rec)

    def _write(self, rec: dict[str, Any]) -> None:
        self._fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def add(self, rec: dict[str, Any]) -> None:
        rid = str(rec["id"])
        if rid in self.done:
            return
        self.done[rid] = rec
        self._write(rec)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def finalize(self, order: list[str]) -> None:
        """All ids done: write them in input order to <out> atomically and drop the partial file."""
        self.close()
        tmp = self.out.with_name(self.out.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for rid in order:
                fh.write(json.dumps(self.done[rid], ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.out)
        self.partial.unlink(missing_ok=True)
