"""Resumable JSONL results that never serve or overwrite another job's records.

Each record carries the `RecordFingerprint` of what produced it (model file, options, prompt).
Finished records are appended to `<out>.partial`, flushed and fsynced one by one, so a crash
or Ctrl-C loses nothing reported finished. A rerun keeps only records whose fingerprint
matches this run's; the others are recomputed and counted by reason. An `--out` that holds
anything else (lines that are not our records, ids not in the prompt file, or — without
`--overwrite` — records made from other inputs) is refused, never overwritten. When every
prompt is done the records go, in input order, to a temp file renamed to `<out>`.
`lock()` holds `<out>` for this process so two runs never write one file.
"""

from __future__ import annotations

import errno
import json
import os
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexlamps import fault_points
from flexlamps.io.atomic import atomic_output
from flexlamps.io.fingerprint import RecordFingerprint
from offload.folders import UnusablePathError, make_writable_folder
from offload.lock import PathLock


_CHECK = "_crc32"  # partial-file lines only; never in <out>


class ResultsError(ValueError):
    pass


@dataclass
class ResumeState:
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> record kept as finished
    recompute: Counter = field(default_factory=Counter)            # reason -> records redone
    damaged: list[str] = field(default_factory=list)               # "file:line" dropped from the partial file

    def describe(self) -> str | None:
        """One line on what is recomputed and why, or None when nothing is."""
        parts = [f"{n} made with {why}" for why, n in self.recompute.most_common()]
        if self.damaged:
            parts.append(f"{len(self.damaged)} damaged ({', '.join(self.damaged[:3])})")
        if not parts:
            return None
        return f"recomputing {sum(self.recompute.values()) + len(self.damaged)} finished records: {'; '.join(parts)}"


class ResumableResults:
    """Args:
        out: the final JSONL file (`--out`).
        expected: this run's fingerprint for every prompt id.
        overwrite: recompute records of `out` made from other inputs instead of refusing.
    """

    def __init__(self, out: str | Path, expected: dict[str, RecordFingerprint], overwrite: bool = False):
        self.given = Path(out)
        self.out = self.given.resolve()  # a symlink's target: what is written, locked and resumed
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.expected, self.overwrite = expected, overwrite
        self.state = ResumeState()
        self._fh = None
        self._lock = None

    @property
    def done(self) -> dict[str, dict[str, Any]]:
        return self.state.done

    def lock(self) -> None:
        """Create `out`'s folder and hold `out` for this process (PathInUseError when taken)."""
        try:
            make_writable_folder(self.out.parent, "--out", shown=self.given)
            self._lock = PathLock(self.out, "--out", shown=self.given).acquire()
        except UnusablePathError as e:
            raise ResultsError(str(e)) from None
        for tmp in self.out.parent.glob(f".{self.out.name}.*.tmp"):  # left by a run killed mid-rename
            tmp.unlink(missing_ok=True)

    def load(self) -> ResumeState:
        """Read records finished by earlier runs: the final file, then the partial one."""
        stale: dict[str, str] = {}  # id -> why its record was not kept
        stale_final: dict[str, str] = {}
        for path in (self.out, self.partial):
            if path.exists():
                final = path == self.out
                for n, line in _lines(path, truncate_torn=not final):
                    rid, why = self._take(path, n, line, final)
                    if why is not None:
                        stale.setdefault(rid, why)
                        if final:
                            stale_final.setdefault(rid, why)
        still = Counter(why for rid, why in stale_final.items() if rid not in self.done)
        if still and not self.overwrite:
            reasons = ", ".join(f"{k} made with {why}" for why, k in still.most_common())
            raise ResultsError(f"--out {self.out} holds finished records from other inputs ({reasons}); add "
                               "--overwrite to recompute them (matching records are kept), or choose another --out")
        self.state.recompute = Counter(why for rid, why in stale.items() if rid not in self.done)
        return self.state

    def _take(self, path: Path, n: int, line: bytes, final: bool) -> tuple[str | None, str | None]:
        """Keep one line's record when it matches; else (id, why not). Raises when it is not ours."""
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            rec = None
        if not isinstance(rec, dict) or "id" not in rec:
            if final:
                raise ResultsError(f"--out {path} line {n} is not a flexlamps record; the file holds other data: "
                                   "choose another --out or move the file away")
            self.state.damaged.append(f"{path.name} line {n}")  # our own file, damaged: redo that record
            return None, None
        if not final and not _check_ok(rec):
            self.state.damaged.append(f"{path.name} line {n}")  # bytes changed after writing
            return None, None
        rid = str(rec["id"])
        if rid not in self.expected:
            raise ResultsError(f"{path} line {n} holds id {rid!r}, which is not in the prompt file: it belongs to "
                               "another job; choose another --out or move the file away")
        if rid in self.done:
            return rid, None
        why = self.expected[rid].mismatch(RecordFingerprint.from_json(rec.get("fingerprint")))
        if why is None:
            self.done[rid] = rec
        return rid, why

    def open(self) -> None:
        """Start `<out>.partial` afresh with the kept records, then append to it."""
        if self.partial.exists() or self.done:
            _write_atomic(self.partial, [_with_check(r) for r in self.done.values()], self.out)
        try:
            self._fh = open(self.partial, "a", encoding="utf-8")
        except OSError as e:
            raise ResultsError(f"--out {self.out}: cannot write {self.partial.name}: {e.strerror}") from None

    def add(self, rec: dict[str, Any]) -> None:
        rid = str(rec["id"])
        if rid in self.done:
            return
        rec = {**rec, "fingerprint": self.expected[rid].to_json()}
        try:
            self._fh.write(_with_check(rec) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:
            raise ResultsError(_write_failure(self.out, e)) from None
        self.done[rid] = rec
        fault_points.reached("record")

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass  # a failed flush was reported by add()
            self._fh = None

    def release(self) -> None:
        self.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def finalize(self, order: list[str]) -> None:
        """All ids done: write them in input order to <out> atomically and drop the partial file."""
        self.close()
        _write_atomic(self.out, [json.dumps(self.done[rid], ensure_ascii=False) for rid in order], self.out)
        fault_points.reached("finalized")
        self.partial.unlink(missing_ok=True)


def _lines(path: Path, truncate_torn: bool):
    """(line number, bytes) of each complete line; a torn last line (a killed run) is cut off."""
    data = path.read_bytes()
    good = 0
    for n, line in enumerate(data.splitlines(keepends=True), 1):
        if not line.endswith(b"\n") and truncate_torn:
            break
        good += len(line)
        if line.strip():
            yield n, line
    if truncate_torn and good < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good)


def _write_failure(out: Path, e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return (f"--out {out}: the disk filled up; the records finished so far are safe in {out.name}.partial. "
                "Free space and rerun the same command to resume")
    return f"--out {out}: writing failed ({e.strerror}); rerun the same command to resume"


def _with_check(rec: dict[str, Any]) -> str:
    """A partial-file line: the record plus a CRC of its JSON, so a changed byte is caught."""
    body = json.dumps(rec, ensure_ascii=False, sort_keys=True)
    return json.dumps({**rec, _CHECK: zlib.crc32(body.encode("utf-8"))}, ensure_ascii=False)


def _check_ok(rec: dict[str, Any]) -> bool:
    """Strip and verify a partial line's CRC."""
    crc = rec.pop(_CHECK, None)
    body = json.dumps(rec, ensure_ascii=False, sort_keys=True)
    return crc is not None and crc == zlib.crc32(body.encode("utf-8"))


def _write_atomic(path: Path, lines: list[str], out: Path) -> None:
    try:
        with atomic_output(path, fsync=True) as fh:
            for line in lines:
                fh.write(line + "\n")
    except OSError as e:
        raise ResultsError(_write_failure(out, e)) from None
