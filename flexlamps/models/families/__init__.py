"""One short module per architecture family (a `Family`: config parsing, weights as data, checkpoint
names), over the shared blocks. A module of this package that defines `FAMILY` registers it: the
registry below finds them, so adding a family is adding its module. This is the one list of what
flexlamps runs. Torch-free: `flexlamps plan` accepts exactly what `generate` accepts by reading it."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from flexlamps.models.errors import UnsupportedModelError
from flexlamps.models.families.family import Family

# how `flexlamps models` lists the families: by forward kind in this order, then by name
FORWARD_ORDER = ("decoder", "opt", "mla", "hybrid")


@lru_cache(maxsize=None)
def families() -> tuple[Family, ...]:
    """Every `FAMILY` a module of this package defines, in listing order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        family = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):
            found.append(family)
    return tuple(sorted(found, key=lambda f: (FORWARD_ORDER.index(f.forward), f.name)))


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
