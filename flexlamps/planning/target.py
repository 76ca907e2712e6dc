"""What a plan and its dry run are for: the run's model (its one `ModelConfig` and the planner's
`ModelSpec` built from it once) as the executor holds it, the lengths of one block of sequences, and
the compression the plan may use."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import placement
from flexlamps.models.config import ModelConfig
from placement.routing import RoutingProfile


@dataclass(frozen=True, kw_only=True)
class PlanTarget:
    """The model a run plans for, as its executor runs it."""

    config: ModelConfig  # the family's one reading of config.json / GGUF metadata
    model: placement.ModelSpec  # the planner's view of `config` (`models.description.model_spec`), built once a run
    dtype: torch.dtype = torch.float16  # compute dtype (and dense weights' stored dtype)
    weight_quant: str | None = None  # the executor's weight compression backend (groupwise8 stores 8-bit weights)
    routing: RoutingProfile | None = None  # a MoE model's measured routing (None: uniform)
    # a checkpoint's blocks the executor keeps as they are: {name: a matrix in the form kept}
    # (`engine.executors.weight_store.in_place_coded`: a GGUF's codes, sized by their kind); None: none
    in_place: dict | None = None


@dataclass(frozen=True, kw_only=True)
class BlockLengths:
    """The lengths one block of sequences runs with."""

    prompt_len: int  # tokens of the longest prompt (the cache holds it whole)
    gen_len: int  # tokens each sequence generates
    prefix_len: int = 0  # a prefix every prompt shares, held in a one-row cache of its own
    logits_per_row: int = 1  # positions of a prompt row whose logits the prefill returns (scoring: every one)


@dataclass(frozen=True, kw_only=True)
class Compression:
    """Compression the plan may or must use: `weight`/`cache` the user's choice (True: planned with
    it on, so the plan prices what runs; False: off; None: the planner's choice where `allow`)."""

    allow: bool = True
    weight: bool | None = None
    cache: bool | None = None

    def solve_options(self) -> dict[str, bool]:
        """`placement.solve`'s compression keywords."""
        return dict(allow_weight_compression=self.allow if self.weight is None else self.weight,
                    allow_cache_compression=self.allow if self.cache is None else self.cache,
                    require_weight_compression=bool(self.weight), require_cache_compression=bool(self.cache))
