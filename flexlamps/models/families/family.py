"""`Family`: what one architecture family declares, as data (torch-free: `plan` reads it too).

A family module parses its `config.json` into a `ModelConfig`, lists its weights (`WeightSpec`s,
our names) and maps them to its checkpoint's tensor names; its forward is assembled from the
shared blocks and named by `forward` (a key of `models.forward.FORWARDS`). Everything a run does
with a model goes through these, so adding a family is one module (the registry finds its `FAMILY`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from flexlamps.models.config import ModelConfig
    from flexlamps.models.weight_specs import FusedPart, WeightSpec


@dataclass(frozen=True)
class Family:
    name: str  # shown by `flexlamps models`
    model_types: tuple[str, ...]  # the HF config.json model_type values it reads
    forward: str  # which forward runs it (models.forward.FORWARDS)
    parse: Callable[[dict], "ModelConfig"]  # config.json -> ModelConfig; UnsupportedModelError naming the field
    weights: Callable[["ModelConfig"], list["WeightSpec"]]  # every tensor the forward reads
    hf_name: Callable[["ModelConfig", "WeightSpec"], str]  # a weight's name in the HF checkpoint
    # where a weight lies inside a fused checkpoint tensor (gpt-oss's experts), None: its own tensor
    hf_part: Callable[["ModelConfig", "WeightSpec"], "FusedPart | None"] | None = None
    gguf_architectures: tuple[str, ...] = ()  # llama.cpp's general.architecture values it reads
    # config.json fields `parse` reads (beside hf_fields.INERT_FIELDS): every field of transformers'
    # config class for its model types is one or the other (tests/unit/test_model_families.py)
    reads: frozenset[str] = frozenset()
    examples: str = ""  # models people bring of this family, for `flexlamps models`
