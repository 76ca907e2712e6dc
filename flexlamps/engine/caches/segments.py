"""Attention of a packed step (see executors.step.Segments), for the caches that pack rows.

Each segment's queries attend to its own keys, gathered from the row so that they start at 0 in
the order of the segment's sequence: the same shapes and summation order as that sequence in a
row of its own, so float32 results equal unpacked scoring's (a mask over the whole row would sum
the same values in another order).
"""

from __future__ import annotations

import torch

from flexlamps.engine.executors.step import Segments
from flexlamps.models.blocks.attention import AttnOptions, attention, windowed


def with_fresh(cached: torch.Tensor | None, fresh: torch.Tensor) -> torch.Tensor:
    """The keys (or values) of a packed step's rows: `cached` (n, kv_heads, fresh_from, d), the
    rows before the step's own tokens (None: there are none), then `fresh` (n, T, kv_heads, d),
    the step's own, as computed."""
    own = fresh.transpose(1, 2)  # (n, kv_heads, T, d)
    return own if cached is None else torch.cat([cached, own.to(cached.device, cached.dtype)], dim=2)


def segment_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, segments: Segments,
                      opts: AttnOptions | None = None) -> torch.Tensor:
    """q (n, T, heads, d), keys/values (n, kv_heads, S, d) -> (n, T, heads, d); tokens in no
    segment (a row's padding) get zeros. A segment's keys are its sequence's positions 0..K-1, so
    a sliding window cuts its mask by key index."""
    out = q.new_zeros(q.shape)
    for g in segments.groups:
        kg = keys[g.rows[:, None], :, g.keys].transpose(1, 2)  # (G, K, kv_heads, d) -> (G, kv_heads, K, d)
        vg = values[g.rows[:, None], :, g.keys].transpose(1, 2)
        qg = q[g.rows[:, None], g.queries].transpose(1, 2)  # (G, Q, heads, d) -> (G, heads, Q, d)
        mask = windowed(g.mask, opts.window if opts is not None else None)
        og = attention(qg, kg, vg, mask, opts).transpose(1, 2)  # (G, Q, heads, d)
        rows = g.rows[:, None].expand_as(g.queries)
        out[rows[g.query_valid], g.queries[g.query_valid]] = og[g.query_valid]
    return out
