"""transformers' Qwen3-Next / Qwen3.5 forward in float64: the exact values both float32 forwards
(theirs and ours) approximate.

Its modeling code casts to float32 by name in places (the gated delta rule, the RMSNorms), so
loading a checkpoint in float64 still computes those in float32. This runs a private copy of the
module with each such cast made float64 (`torch.float32` -> `torch.float64`, `.float()` ->
`.double()`), the rest of the code untouched, over the same weights."""

from __future__ import annotations

import importlib
import sys
import types

_MODULES = {"qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
            "qwen3_5_text": "transformers.models.qwen3_5.modeling_qwen3_5"}


def _float64_module(model_type: str) -> types.ModuleType:
    original = importlib.import_module(_MODULES[model_type])
    with open(original.__file__) as f:
        source = f.read().replace("torch.float32", "torch.float64").replace(".float()", ".double()")
    module = types.ModuleType(original.__name__ + "_float64")
    module.__file__, module.__package__ = original.__file__, original.__package__
    sys.modules[module.__name__] = module  # its decorators look names up through it
    exec(compile(source, original.__file__, "exec"), module.__dict__)
    return module


def float64_logits(reference, ids):
    """reference: transformers' float32 model (not changed); ids (n, T) -> logits (n, T, vocab) fp64."""
    import copy

    import torch

    config = copy.deepcopy(reference.config)
    config._experts_implementation = "eager"  # the grouped-GEMM experts take no float64
    model = getattr(_float64_module(config.model_type), type(reference).__name__)(config).double().eval()
    model.load_state_dict({name: t.double() for name, t in reference.state_dict().items()})
    with torch.no_grad():
        return model(ids).logits
