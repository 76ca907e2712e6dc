"""A dense, preallocated MLA latent cache in one device's memory: the in-memory sparse path.

Per layer and slot it holds each token's latent (kv_lora_rank), rotary key (qk_rope_head_dim)
and, for DeepSeek-V3.2, indexer key (index_head_dim). A prefill (or any step of more than one
token per row) attends over the whole visible span with the top-k selection as a mask; a
decode step (one token per row) scores the indexer keys, gathers only the selected entries
and attends over those — the path the offloaded latent cache must reproduce bit for bit.
"""

from __future__ import annotations

import torch

from flexlamps.models.config import ModelConfig
from flexlamps.models.mla import (MLAStep, gather_entries, index_scores, latent_attention,
                                  select_topk, topk_mask, visible_mask)


class DenseLatentCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        m = cfg.mla
        if m is None:
            raise ValueError(f"a latent cache needs an MLA model, got model_type {cfg.model_type!r}")

        def table(width: int) -> list[torch.Tensor]:
            return [torch.zeros((num_slots, capacity, width), dtype=dtype, device=device)
                    for _ in range(cfg.num_layers)]

        self.latent = table(m.kv_lora_rank)
        self.rope = table(m.qk_rope_head_dim)
        self.index_keys = table(m.index_head_dim) if m.has_indexer else []
        self.capacity = capacity
        self.num_slots = num_slots

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.latent + self.rope + self.index_keys)

    def free(self) -> None:
        """Nothing to hand back: a dense cache is charged to no tier budget."""

    def copy_prefix_from(self, src: "DenseLatentCache", length: int, slots: torch.Tensor) -> None:
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes)."""
        for mine, theirs in ((self.latent, src.latent), (self.rope, src.rope), (self.index_keys, src.index_keys)):
            for layer in range(len(mine)):
                mine[layer][slots, :length] = theirs[layer][0, :length]

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor):
        """The `attend(step)` callback for one layer of one step (see models.deepseek)."""
        return lambda step: self.attend(layer, slots, positions, step)

    def attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, step: MLAStep) -> torch.Tensor:
        rows = slots[:, None]
        self.latent[layer][rows, positions] = step.latent
        self.rope[layer][rows, positions] = step.k_rope
        if step.is_sparse:
            self.index_keys[layer][rows, positions] = step.index_k
        span = int(positions.max()) + 1
        latent, rope = self.latent[layer][slots, :span], self.rope[layer][slots, :span]
        visible = visible_mask(positions, span)
        if not step.is_sparse:
            return latent_attention(step, latent, rope, visible)
        scores = index_scores(step, self.index_keys[layer][slots, :span])
        if positions.shape[1] > 1:
            return latent_attention(step, latent, rope, topk_mask(scores, visible, step.index_topk))
        indices, valid = select_topk(scores, visible, step.index_topk)  # (n, 1, k)
        return latent_attention(step, gather_entries(latent, indices[:, 0]),
                                gather_entries(rope, indices[:, 0]), valid)
