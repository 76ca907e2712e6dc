"""Fingerprints of what a result was computed from, so a rerun never serves results of other
inputs: a file's content, and a model's weights (torch-free, cheap: the config's text and each
weight file's name, size and modification time, as the checkpoint readers key their caches).

Shared by `flexlamps helm` (run identities) and `flexlamps generate` (result records).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin")


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stat_text(path: Path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"


def model_fingerprint(model: str) -> str:
    """16 hex digits naming a model's weights: a built-in name, a Hugging Face folder or a file.
    A name that resolves to nothing is fingerprinted as its text (loading it will fail anyway)."""
    from flexlamps.models.builtin import BUILTIN_MODELS, UnknownModelError, builtin_path

    text = str(model)
    h = hashlib.sha256()
    path = Path(text).expanduser()
    if text.lower() in BUILTIN_MODELS:
        try:
            path = builtin_path(text.lower())
        except UnknownModelError:
            path = None
    if path is not None and path.is_file() and path.name == "config.json":
        path = path.parent
    if path is not None and path.is_dir():
        config = path / "config.json"
        if config.exists():
            h.update(json.dumps(json.loads(config.read_text(encoding="utf-8")), sort_keys=True).encode())
        for f in sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
            h.update(_stat_text(f).encode())
    elif path is not None and path.is_file():
        h.update(_stat_text(path).encode())
    else:
        h.update(text.encode())
    return h.hexdigest()[:16]
