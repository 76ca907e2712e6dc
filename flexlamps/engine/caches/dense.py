"""A dense, preallocated KV cache: one row ("slot") per running sequence, per layer.

Layout per layer: (slots, kv_heads, capacity, head_dim). Sequences write their new keys at
their own positions, so a batch mixes sequences of any length without padding the cache;
attention masks each row at its own length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flexlamps.models.config import ModelConfig


class DenseKVCache:
    def __init__(self, cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        shape = (num_slots, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.capacity = capacity
        self.num_slots = num_slots

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def free(self) -> None:
        """Nothing to hand back: a dense cache is charged to no tier budget (see TieredKVCache)."""

    def copy_prefix_from(self, src: "DenseKVCache", length: int, slots: torch.Tensor) -> None:
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes)."""
        for layer in range(len(self.k)):
            self.k[layer][slots, :, :length] = src.k[layer][0, :, :length]
            self.v[layer][slots, :, :length] = src.v[layer][0, :, :length]

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor):
        """The `attend(q, k, v)` callback for one layer of one step (see models.llama.Attend)."""
        return lambda q, k, v: self.attend(layer, slots, positions, q, k, v)

    def attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
               q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, t, heads, d = q.shape
        kc, vc = self.k[layer], self.v[layer]
        kc[slots[:, None], :, positions] = k
        vc[slots[:, None], :, positions] = v
        span = int(positions.max()) + 1
        keys, values = _rows(kc, slots, span), _rows(vc, slots, span)
        # query at position p sees keys 0..p of its own row: causal and per-row length in one mask
        mask = torch.arange(span, device=q.device)[None, None, :] <= positions[:, :, None]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask[:, None],
                                             enable_gqa=heads != keys.shape[1])
        return out.transpose(1, 2).reshape(n, t, heads * d)


def _rows(cache: torch.Tensor, slots: torch.Tensor, span: int) -> torch.Tensor:
    n = slots.shape[0]
    first = int(slots[0])
    if bool((slots == torch.arange(first, first + n, device=slots.device)).all()):
        return cache[first:first + n, :, :span]  # a contiguous block of rows: a view, no copy
    return cache[slots, :, :span]
