"""One short module per architecture family (a `Family`: config parsing, weights as data, checkpoint
names), over the shared blocks. The registry below is the one list of what flexlamps runs.
Torch-free: `flexlamps plan` accepts exactly what `generate` accepts by reading the same list."""

from __future__ import annotations

import importlib
from functools import lru_cache

from flexlamps.models.errors import UnsupportedModelError
from flexlamps.models.families.family import Family

# the family modules, each defining FAMILY (a Family); order is the order `flexlamps models` lists them
FAMILY_MODULES = ("llama", "qwen3", "gemma", "phi3", "smollm3", "granite", "ernie4_5", "opt", "deepseek", "mixtral", "qwen_moe",
                  "qwen3_moe", "olmoe", "glm4_moe", "gpt_oss", "qwen3_next", "qwen3_5")


@lru_cache(maxsize=None)
def families() -> tuple[Family, ...]:
    return tuple(importlib.import_module(f"flexlamps.models.families.{m}").FAMILY for m in FAMILY_MODULES)


@lru_cache(maxsize=None)
def _by_model_type() -> dict[str, Family]:
    out: dict[str, Family] = {}
    for fam in families():
        for model_type in fam.model_types:
            if model_type in out:
                raise RuntimeError(f"model_type {model_type!r} is claimed by {out[model_type].name} and {fam.name}")
            out[model_type] = fam
    return out


def supported_model_types() -> list[str]:
    return sorted(_by_model_type())


def family_for(model_type: str | None) -> Family:
    """The family reading `model_type`; UnsupportedModelError naming what runs otherwise."""
    fam = _by_model_type().get(model_type or "")
    if fam is None:
        raise UnsupportedModelError(f"model_type {model_type!r} is not supported; flexlamps runs "
                                    f"{', '.join(supported_model_types())} (see `flexlamps models`)")
    return fam
