"""Prompt chunks that start every row at position 0 attend over the keys and values they just
computed, not over the cache they write them to.

Those fresh keys are all such a query may see, so reading them back would only make a second
copy: a gather of the paged cache's blocks, a copy of a cpu-tier layer to the compute device, or
a compressed layer decompressed (the prompt then attends over exact keys, as FlexGen's prefill
does; later steps read the compressed cache). The cache is still written, for the steps after.
"""

from __future__ import annotations

import torch


def is_fresh_prefill(positions: torch.Tensor) -> bool:
    """positions (n, T): whether every row is 0..T-1 (T > 1: a decode reads the cache anyway)."""
    t = positions.shape[1]
    return t > 1 and bool((positions == torch.arange(t, device=positions.device)).all())


def fresh_keys(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v (n, T, kv_heads, d) as attention takes them: (n, kv_heads, T, d) views."""
    return k.transpose(1, 2), v.transpose(1, 2)
