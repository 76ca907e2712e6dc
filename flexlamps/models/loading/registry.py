"""Resolve what a user typed after `--model` into a checkpoint reader. Nothing is ever downloaded."""

from __future__ import annotations

from pathlib import Path

from flexlamps.models.loading.builtin import BUILTIN_MODELS, UnknownModelError, builtin_path
from flexlamps.models.loading.checkpoint import GGUFReader, HFFolderReader


def open_checkpoint(model: str | Path, cache_dir: Path | str | None = None):
    """A reader (config, tokenizer, per-tensor reads) for a built-in name, an HF folder or a GGUF file.
    `cache_dir`: where a GGUF's parsed header is cached (default: the weight cache's folder)."""
    text = str(model)
    if text.lower() in BUILTIN_MODELS:
        return GGUFReader(builtin_path(text.lower()), cache_dir)
    path = Path(text).expanduser()
    if path.is_dir():
        return HFFolderReader(path)
    if path.is_file() and path.suffix == ".gguf":
        return GGUFReader(path, cache_dir)
    if path.is_file() and path.name == "config.json":
        return HFFolderReader(path.parent)
    raise UnknownModelError(
        f"unknown model {text!r}: give a built-in name ({', '.join(sorted(BUILTIN_MODELS))}), "
        "a Hugging Face folder with config.json and *.safetensors, or a .gguf file (nothing is downloaded)"
    )
