"""A gated-DeltaNet token mixer (Qwen3-Next, Qwen3.5) over its per-sequence state.

The engine owns the state, as it owns KV caches: the layer is handed a `StateAccess` for the
step's rows (see engine.caches.state), reads the rows' conv window and recurrent matrices from it
and writes the new ones back.
"""

from __future__ import annotations

from typing import Protocol

import torch

from flexlamps.models.blocks.activation import sigmoid, softplus
from flexlamps.models.blocks.aligned_delta_rule import OpenChunk, aligned_gated_delta_rule
from flexlamps.models.blocks.gated_deltanet import causal_conv, gated_rms_norm
from flexlamps.models.blocks.linear import linear
from flexlamps.models.hybrid_config import HybridConfig


class StateAccess(Protocol):
    """One DeltaNet layer's state for the rows of one step."""
    lengths: torch.Tensor | None  # (n,) real tokens per row (padding after them); None: all T

    def read(self) -> tuple[torch.Tensor, torch.Tensor, OpenChunk]:
        """(conv window (n, C, K-1), recurrent state at the last chunk boundary (n, Hv, dk, dv) fp32,
        the tokens since that boundary), zeros / empty for rows that start a sequence."""

    def write(self, conv: torch.Tensor, recurrent: torch.Tensor, open_chunk: OpenChunk) -> None:
        """The rows' states after their last real token of the step."""


def _projections(w: dict, h: torch.Tensor, hy: HybridConfig):
    """(q|k|v before the convolution (n, T, conv_dim), z (n, T, Hv, dv), b, a (n, T, Hv))."""
    n, t, _ = h.shape
    heads, dv = hy.num_value_heads, hy.value_head_dim
    if "in_proj_qkvz" not in w:  # Qwen3.5: four matrices
        z = linear(h, w["in_proj_z"]).view(n, t, heads, dv)
        return linear(h, w["in_proj_qkv"]), z, linear(h, w["in_proj_b"]), linear(h, w["in_proj_a"])
    # Qwen3-Next: per key head [q, k, its value heads' v, their z] and [their b, their a]
    group = heads // hy.num_key_heads
    qkvz = linear(h, w["in_proj_qkvz"]).view(n, t, hy.num_key_heads, -1)
    q, k, v, z = qkvz.split([hy.key_head_dim, hy.key_head_dim, group * dv, group * dv], dim=-1)
    b, a = linear(h, w["in_proj_ba"]).view(n, t, hy.num_key_heads, 2 * group).split([group, group], dim=-1)
    mixed = torch.cat([q.reshape(n, t, -1), k.reshape(n, t, -1), v.reshape(n, t, -1)], dim=-1)
    return mixed, z.reshape(n, t, heads, dv), b.reshape(n, t, heads), a.reshape(n, t, heads)


def deltanet_mixer(w: dict, h: torch.Tensor, hy: HybridConfig, eps: float, state: StateAccess) -> torch.Tensor:
    """h (n, T, hidden), the layer's normalized input -> the mixer's output (n, T, hidden), before
    the residual add; the rows' states advanced through their real tokens."""
    n, t, _ = h.shape
    mixed, z, b, a = _projections(w, h, hy)
    conv_state, recurrent, open_chunk = state.read()
    mixed, conv_state = causal_conv(mixed, conv_state, w["conv1d"], state.lengths)
    q, k, v = mixed.split([hy.key_dim, hy.key_dim, hy.value_dim], dim=-1)
    q = q.reshape(n, t, hy.num_key_heads, hy.key_head_dim)
    k = k.reshape(n, t, hy.num_key_heads, hy.key_head_dim)
    v = v.reshape(n, t, hy.num_value_heads, hy.value_head_dim)
    beta = sigmoid(b)  # these two as a row alone would get them (models.blocks.activation)
    g = -w["A_log"].float().exp() * softplus(a.float() + w["dt_bias"])
    # one form for prompts and decodes, on chunks at absolute positions: the same bits however the
    # sequence is split into steps (models.blocks.aligned_delta_rule); padding after `lengths` ignored
    core, recurrent, open_chunk = aligned_gated_delta_rule(q, k, v, g, beta, recurrent, open_chunk, state.lengths)
    state.write(conv_state, recurrent, open_chunk)
    out = gated_rms_norm(core.to(h.dtype), z, w["linear_norm"], eps)
    return linear(out.reshape(n, t, hy.value_dim), w["out_proj"])
