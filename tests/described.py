"""The tests' one way from a config.json dict to what planning takes: the family's `ModelConfig`
and the planner's `ModelSpec` built from it (as a run builds them once), and the `PlanTarget` a
plan or dry run is for. Not a product fallback: product code builds these from its reader."""

from __future__ import annotations

import torch

import placement
from flexlamps.models.config import ModelConfig
from flexlamps.models.description import model_spec
from flexlamps.planning.target import PlanTarget


def described(config: dict | ModelConfig, name: str | None = None) -> tuple[ModelConfig, placement.ModelSpec]:
    """(ModelConfig, ModelSpec) of `config` (a config.json dict its family parses, or a parsed one)."""
    cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_hf(config)
    return cfg, model_spec(cfg, name)


def plan_target(config: dict | ModelConfig, dtype: torch.dtype = torch.float16, **fields) -> PlanTarget:
    """`PlanTarget` of `config` in `dtype`; `fields`: its weight_quant, routing."""
    cfg, spec = described(config)
    return PlanTarget(config=cfg, model=spec, dtype=dtype, **fields)
