"""Weights described as data: every tensor an architecture needs, with its shape and role.

The planner sizes a model from this list, the offload store places it, and the loaders map
checkpoint names onto it, all without running the model. Names are ours ("layers.3.q_proj");
`hf_name` gives the Hugging Face checkpoint name of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flexlamps.models.families import family_for

if TYPE_CHECKING:
    from flexlamps.models.config import ModelConfig

# role: "linear" (2-D matmul weight, compressible), "embed", "norm", "bias"
@dataclass(frozen=True)
class WeightSpec:
    name: str
    shape: tuple[int, ...]
    role: str
    layer: int | None  # None for the embedding / head tensors

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def local_name(self) -> str:
        """Name inside its layer ("q_proj"), or the full name for non-layer tensors."""
        return self.name.split(".", 2)[2] if self.layer is not None else self.name


@dataclass(frozen=True)
class FusedPart:
    """A weight stored inside a larger checkpoint tensor (gpt-oss keeps all experts of a layer in
    one): slab `index` of tensor `name`, its output rows every `stride`-th from `start`.
    `transposed`: the dense slab is stored (in, out); an MXFP4 one (`name`_blocks / _scales) is
    always (out, in)."""
    name: str
    index: int
    start: int = 0
    stride: int = 1
    transposed: bool = False


# FP8 matrices the engine keeps in FP8: those the forward multiplies (linear), slices per head
# (absorbed) or routes with ("router": the MoE gate, the indexer's head weights; upcast per call
# to the compute dtype, then run in fp32, the values an upcast at load gives). DeepSeek's own
# checkpoints store those two in bf16, so there they are plain tensors anyway.
FP8_KEPT_ROLES = ("linear", "absorbed", "router")


def keeps_fp8(spec: WeightSpec) -> bool:
    """Whether the engine keeps this weight in FP8 when its checkpoint stores it so."""
    return spec.role in FP8_KEPT_ROLES and spec.layer is not None and len(spec.shape) == 2


def weight_specs(cfg: "ModelConfig") -> list[WeightSpec]:
    """Every tensor `cfg`'s forward reads, in checkpoint order (its family's list)."""
    return family_for(cfg.model_type).weights(cfg)


def hf_name(cfg: "ModelConfig", spec: WeightSpec) -> str:
    """`spec`'s tensor name in the model's Hugging Face checkpoint."""
    return family_for(cfg.model_type).hf_name(cfg, spec)


def hf_part(cfg: "ModelConfig", spec: WeightSpec) -> FusedPart | None:
    """Where `spec` lies inside a fused checkpoint tensor, or None when it is a tensor of its own."""
    part = family_for(cfg.model_type).hf_part
    return part(cfg, spec) if part is not None else None


def total_bytes(cfg: "ModelConfig", dtype_bytes: int) -> int:
    return sum(s.numel for s in weight_specs(cfg)) * dtype_bytes


def layer_spec(i: int, local: str, shape: tuple[int, ...], role: str) -> WeightSpec:
    return WeightSpec(f"layers.{i}.{local}", shape, role, i)


def head_specs(cfg: "ModelConfig") -> list[WeightSpec]:
    """The final norm and, unless tied to the embedding, the output head."""
    specs = [WeightSpec("norm", (cfg.hidden_size,), "norm", None)]
    if not cfg.tie_word_embeddings:
        specs.append(WeightSpec("lm_head", (cfg.vocab_size, cfg.hidden_size), "embed", None))
    return specs
