"""Fingerprints of what a result was computed from, so a rerun never serves results of other
inputs. Shared by `flexlamps helm` (run identities) and `flexlamps generate` (result records).

- `stable_hash(obj)`: sha256 of a JSON-able object (keys sorted), 16 hex digits.
- `file_sha256(path)`: a file's content hash, cached by (path, size, mtime, inode, ctime) in
  `file-hashes.json` in flexlamps' cache folder (flexlamps.cache_folder) so a 100 MB GGUF is hashed once, not on every run.
- `model_fingerprint(model)`: what `--model` names, by content: a GGUF file's hash, or a
  Hugging Face folder's config, tokenizer and weight files (`model_digest(path)`).
- `RecordFingerprint`: the three parts a generated record carries (model, options, prompt),
  kept apart so a mismatch can say which changed.

Imports only the stdlib (torch-free).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from flexlamps.cache_folder import cache_root
from flexlamps.models.loading.builtin import BUILTIN_MODELS, UnknownModelError, builtin_path

_HASH_CHUNK = 1 << 22
# files of a Hugging Face folder that decide what the model computes
_MODEL_FILE_SUFFIXES = (".safetensors", ".json", ".model", ".txt", ".gguf")


def stable_hash(obj) -> str:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def file_sha256(path: str | Path, cache_file: Path | None = None) -> str:
    """The sha256 of a file's bytes; reused from the cache while size, mtime, inode and ctime
    are unchanged (any write or replacement changes one of them)."""
    path = Path(path).resolve()
    cache_file = cache_file or cache_root() / "file-hashes.json"
    key = _stat_key(path.stat())
    cache = _read_cache(cache_file)
    hit = cache.get(str(path))
    if hit and hit.get("stat") == key:
        return hit["sha256"]
    digest = _hash_file(path)
    if _stat_key(path.stat()) == key:  # not written to while we read it
        cache[str(path)] = {"stat": key, "sha256": digest}
        _write_cache(cache_file, cache)
    return digest


def _read_cache(cache_file: Path) -> dict:
    try:
        data = json.loads(cache_file.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing or damaged: hash again


def _write_cache(cache_file: Path, cache: dict) -> None:
    # a unique temp file then a rename: concurrent runs never see a half-written cache
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_file.parent, prefix=".file-hashes-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(cache, fh)
        os.replace(tmp, cache_file)
    except OSError:
        pass  # an unwritable cache only costs a rehash next time


def model_digest(path: str | Path) -> str:
    """Content hash of a checkpoint: a single file (GGUF), or a folder's model files."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)[:16]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES)
    return stable_hash({p.name: file_sha256(p) for p in files})


def model_fingerprint(model: str) -> str:
    """16 hex digits naming a model's weights by content: a built-in name, a Hugging Face
    folder (or its config.json) or a GGUF file. A name that resolves to nothing is
    fingerprinted as its text (loading it will fail anyway)."""
    text = str(model)
    path = Path(text).expanduser()
    if text.lower() in BUILTIN_MODELS:
        try:
            path = builtin_path(text.lower())
        except UnknownModelError:
            return stable_hash(text)
    if path.is_file() and path.name == "config.json":
        path = path.parent
    return model_digest(path) if path.exists() else stable_hash(text)


@dataclass(frozen=True, slots=True)
class RecordFingerprint:
    """What produced one generated record, each part a `stable_hash`."""
    model: str    # the checkpoint's content (`model_digest`)
    options: str  # dtype, compression, chat wrapping, sampling options
    prompt: str   # the prompt's id, text and the extra fields copied to the output

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj) -> RecordFingerprint | None:
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in ("model", "options", "prompt")):
            return None
        return cls(model=obj["model"], options=obj["options"], prompt=obj["prompt"])

    def mismatch(self, other: RecordFingerprint | None) -> str | None:
        """None when equal, else what differs, in words."""
        if other is None:
            return "no fingerprint"
        for part, words in (("model", "another model file"), ("options", "other options"),
                            ("prompt", "other prompt text")):
            if getattr(self, part) != getattr(other, part):
                return words
        return None
