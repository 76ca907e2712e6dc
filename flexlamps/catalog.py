"""The torch-free part of the Python API: what this installation runs (the model families, each
with the cache it keeps and what it runs, and the built-in model names) and a model's description
for the planner (`placement.ModelSpec`), read from its config.json or a preset without torch or
weights. `flexlamps models` and `flexlamps plan` are thin layers over it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import placement
from placement.presets import model_presets

from flexlamps.models.config import ModelConfig
from flexlamps.models.description import model_spec
from flexlamps.models.families import families
from flexlamps.models.families.support import SUPPORT, runs
from flexlamps.models.loading.builtin import BUILTIN_MODELS
from flexlamps.models.loading.gguf_description import gguf_model_spec


@dataclass(frozen=True)
class FamilyInfo:
    name: str
    model_types: tuple[str, ...]  # the config.json model_type values it reads
    gguf_architectures: tuple[str, ...]  # llama.cpp's general.architecture values it reads
    cache: str  # what a sequence keeps ("KV", "MLA latent", ...)
    runs: str  # in memory, offloaded, 4-bit weights[, agents]
    examples: str  # models people bring of this family


def model_families() -> list[FamilyInfo]:
    """Every family flexlamps runs, in the registry's order."""
    return [FamilyInfo(f.name, f.model_types, f.gguf_architectures, SUPPORT[f.forward].cache, runs(f.forward),
                       f.examples) for f in families()]


def builtin_models() -> list[str]:
    """The names `LLM(model=...)` and `--model` take without a file."""
    return sorted(BUILTIN_MODELS)


def describe_model(text: str) -> placement.ModelSpec:
    """The planner's description of a model given as a config.json path, an HF folder holding one,
    a GGUF file (its family's reader of the metadata, as the engine reads it; its matrices kept as
    the file's blocks at the bytes our kernels hold them in, `gguf_model_spec`), or a preset name
    (`placement.model_presets()`); a ValueError naming the input otherwise."""
    path = Path(text)
    if path.is_file() and _is_gguf(path):
        try:
            return gguf_model_spec(path, name=path.stem)
        except (ValueError, TypeError) as exc:  # a CheckpointError or UnsupportedModelError among them
            raise ValueError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"folder {text!r} has no config.json")
    if path.is_file():
        try:
            config = ModelConfig.from_hf(json.loads(path.read_text()))
            return model_spec(config, name=path.parent.name or path.stem)
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise ValueError(f"{path}: {exc}") from None
    try:
        return placement.model_preset(text)
    except KeyError:
        raise ValueError(f"{text!r} is neither a config.json, an HF folder, a GGUF file, nor a preset "
                         f"({', '.join(model_presets())})") from None


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"  # the format's magic
