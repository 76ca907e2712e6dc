"""No silent drops: a checkpoint tensor no weight of the model's description reads is an error naming
it, raised when the checkpoint is opened, before any weight is read (a bias the forward would skip,
a norm of a variant we do not run). Known-harmless extras are allowed by name: transformers' rotary
`inv_freq` buffers, DeepSeek's multi-token-prediction layers (past num_hidden_layers, unused to
generate) and Qwen3-Next's / Qwen3.5's (top-level `mtp.*`, which transformers skips too), an FP8
matrix's `_scale_inv` tiles (read with the matrix)."""

from __future__ import annotations

import re
from typing import Any, Iterable

from flexlamps.models.config import ModelConfig

HARMLESS = (re.compile(r"(^|\.)rotary_emb\.inv_freq$"), re.compile(r"^mtp\."))
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def unread_tensors(names: Iterable[str], read: set[str], config: ModelConfig) -> list[str]:
    """The tensors in `names` (a checkpoint's) that are not in `read` (the names `config`'s weights are
    read from) and not a known-harmless extra, sorted."""
    layers, mtp = config.num_layers, config.storage.mtp_layers
    out = []
    for name in names:
        if name in read or any(p.search(name) for p in HARMLESS):
            continue
        if name.endswith("_scale_inv") and name[:-len("_scale_inv")] in read:
            continue
        layer = _LAYER.match(name)
        if layer and mtp and layers <= int(layer.group(1)) < layers + mtp:
            continue
        out.append(name)
    return sorted(out)


# read into the config, not as weights: Phi-3's LongRoPE factors
GGUF_CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")


def unread_gguf_tensors(names: Iterable[str], read: set[str], fields: dict[str, Any], layers: int) -> list[str]:
    """A GGUF's tensors in `names` not in `read`, nor config tensors, nor the blocks of its
    multi-token-prediction layers past `layers` (llama.cpp counts them in block_count), sorted."""
    mtp = fields.get(f"{fields.get('general.architecture')}.nextn_predict_layers") or 0
    return sorted(n for n in names if n not in read and n not in GGUF_CONFIG_TENSORS
                  and not (mtp and n.startswith("blk.") and int(n.split(".")[1]) >= layers))


def unread_error(where: str, unread: list[str], family: str) -> str:
    """The one-line message for `unread` tensors (the first few named)."""
    shown = ", ".join(unread[:3]) + (f" and {len(unread) - 3} more" if len(unread) > 3 else "")
    return (f"{where}: checkpoint tensor{'s' if len(unread) > 1 else ''} {shown} "
            f"{'are' if len(unread) > 1 else 'is'} not read by flexlamps' {family} model, which would run "
            "without it; its config.json turns on an option flexlamps does not run, or the checkpoint is "
            "not the model its config describes")
