"""`Step`: one micro-batch of one forward sweep, the unit every executor runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Step:
    """Tokens (n, T) at positions (n, T) in cache rows `slots` (n,). `logit_rows` picks the
    indices along T whose logits are returned: (n,) one per row (the last real token), (n, K)
    K per row; None returns all.

    Packed rows (several independent sequences in one cache row, e.g. many questions scored in
    one forward): `cache_positions` (n, T) says where each token's keys and values go in its row
    when that is not its position (the position only sets the rotary phase), and `visible`
    (n, T, S) which of the row's cache positions 0..S-1 each token attends to (its own
    sequence's). None: a token is written at its position and sees the row's positions up to it.
    Only caches with `packs_rows = True` accept packed steps."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logit_rows: torch.Tensor | None = None
    cache_positions: torch.Tensor | None = None
    visible: torch.Tensor | None = None

    @property
    def write_positions(self) -> torch.Tensor:
        """Where each token's keys and values go in its cache row (n, T)."""
        return self.positions if self.cache_positions is None else self.cache_positions

    @property
    def mask_kwargs(self) -> dict:
        """The packed-row mask for a cache's `attend_fn` / `step_geometry` ({} when causal)."""
        return {} if self.visible is None else {"visible": self.visible}

    def pick_logit_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (n, T, h) -> those at `logit_rows`: (n, 1, h), (n, K, h), or all."""
        if self.logit_rows is None:
            return x
        rows = self.logit_rows.to(x.device)
        index = torch.arange(x.shape[0], device=x.device)
        return x[index, rows][:, None] if rows.dim() == 1 else x[index[:, None], rows]
