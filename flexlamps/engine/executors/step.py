"""`Step`: one micro-batch of one forward sweep, the unit every executor runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Step:
    """Tokens (n, T) at positions (n, T) in cache rows `slots` (n,). `logit_rows` (n,) picks the
    index along T whose logits are returned per row (the last real token); None returns all."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logit_rows: torch.Tensor | None = None
