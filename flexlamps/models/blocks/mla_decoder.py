"""DeepSeek-V3 / V3.2 forward, layer by layer: MLA attention (with the V3.2 lightning indexer)
and a dense or mixture-of-experts FFN.

As in `llama.py`, weights are handed in and attention is a callback: `attend(step)` takes an
`MLAStep` (the absorbed query, the new tokens' latents, rotary keys and indexer keys), stores
the new entries in the engine's latent cache, selects and gathers what each query attends to,
and returns the attended latents (n, H, T, R); the layer expands them with W_UV.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from flexlamps.models.config import ModelConfig
from flexlamps.models.blocks.activation import silu
from flexlamps.models.blocks.linear import linear, unpack
from flexlamps.models.blocks.norms import rms_norm
from flexlamps.models.blocks.mla import MLAStep, absorb_query, expand_values
from flexlamps.models.blocks.moe import moe_ffn
from flexlamps.models.blocks.rope import (apply_rope, apply_rope_interleaved, inverse_frequencies,
                                   rope_attention_factor, rope_cos_sin)

AttendLatent = Callable[[MLAStep], torch.Tensor]
# transformers builds the q/kv latent norms and the indexer's key LayerNorm with this eps
LATENT_NORM_EPS = 1e-6


class DeepseekForward:
    def __init__(self, cfg: ModelConfig):
        if cfg.mla is None:
            raise ValueError(f"DeepseekForward needs an MLA config, got model_type {cfg.model_type!r}")
        self.cfg = cfg
        self.inv_freq = inverse_frequencies(cfg)  # cfg.head_dim is the rotary width
        self.rope_scale = rope_attention_factor(cfg)

    def step_context(self, positions: torch.Tensor, dtype: torch.dtype):
        """RoPE cos/sin (n, T, qk_rope_head_dim) for these positions, shared by all layers."""
        return rope_cos_sin(self.inv_freq, positions, dtype, self.rope_scale)

    def embed(self, w: dict[str, torch.Tensor], input_ids: torch.Tensor, positions: torch.Tensor):
        return F.embedding(input_ids, w["embed_tokens"])

    def layer(self, w: dict[str, torch.Tensor], x: torch.Tensor, ctx, attend: AttendLatent, index: int) -> torch.Tensor:
        eps = self.cfg.norm_eps
        x = linear(self.attention(w, rms_norm(x, w["attn_norm"], eps), ctx, attend), w["o_proj"], add=x)
        h = rms_norm(x, w["mlp_norm"], eps)
        if "router" in w:
            return x + moe_ffn(w, h, self.cfg.moe)
        gate = silu(linear(h, w["gate_proj"]), inplace=True)
        return linear(linear(h, w["up_proj"], mul=gate), w["down_proj"], add=x)

    def attention(self, w: dict[str, torch.Tensor], h: torch.Tensor, ctx, attend: AttendLatent) -> torch.Tensor:
        """h (n, T, hidden) -> attention output (n, T, heads * v_head_dim), before o_proj."""
        m, heads = self.cfg.mla, self.cfg.num_heads
        n, t, _ = h.shape
        cos, sin = ctx
        rotate = apply_rope_interleaved if m.rope_interleave else apply_rope
        q_resid = None
        if m.q_lora_rank:
            q_resid = rms_norm(linear(h, w["q_a_proj"]), w["q_a_norm"], LATENT_NORM_EPS)
            q = linear(q_resid, w["q_b_proj"])
        else:
            q = linear(h, w["q_proj"])
        q = q.view(n, t, heads, m.qk_head_dim)
        q_nope, q_rope = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        q_rope = rotate(q_rope, cos, sin)
        latent, k_rope = linear(h, w["kv_a_proj"]).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = rms_norm(latent, w["kv_a_norm"], LATENT_NORM_EPS)
        k_rope = rotate(k_rope.unsqueeze(2), cos, sin).squeeze(2)  # (n, T, r): one key for all heads
        # kv_b_proj rows are, per head, nope key rows then value rows: (H, nope + v, R)
        kv_b = unpack(w["kv_b_proj"]).view(heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        w_uk, w_uv = kv_b.split([m.qk_nope_head_dim, m.v_head_dim], dim=1)
        step = MLAStep(
            q_latent=absorb_query(q_nope, w_uk),  # (n, H, T, R)
            q_rope=q_rope.transpose(1, 2),  # (n, H, T, r)
            latent=latent, k_rope=k_rope, softmax_scale=m.softmax_scale)
        if m.has_indexer:
            self._index_inputs(w, h, q_resid, ctx, step)
        return expand_values(attend(step), w_uv)  # (n, T, H * v)

    def _index_inputs(self, w, h: torch.Tensor, q_resid: torch.Tensor, ctx, step: MLAStep) -> None:
        """The lightning indexer's queries, head weights and new keys (V3.2), onto `step`.
        Its rotary part is the first qk_rope_head_dim dims, rotated half-split (not interleaved)."""
        m = self.cfg.mla
        n, t, _ = h.shape
        cos, sin = ctx
        rope = m.qk_rope_head_dim
        q = linear(q_resid, w["index_q_proj"]).view(n, t, m.index_num_heads, m.index_head_dim)
        q = torch.cat([apply_rope(q[..., :rope], cos, sin), q[..., rope:]], dim=-1)
        k = F.layer_norm(linear(h, w["index_k_proj"]), (m.index_head_dim,), w["index_k_norm"],
                         w["index_k_norm_bias"], LATENT_NORM_EPS).unsqueeze(2)
        k = torch.cat([apply_rope(k[..., :rope], cos, sin), k[..., rope:]], dim=-1).squeeze(2)
        weights = linear(h.float(), unpack(w["index_weights"]).float()) * m.index_num_heads ** -0.5
        step.index_q, step.index_k, step.index_w, step.index_topk = q, k, weights, m.index_topk

    def final_hidden(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w["norm"], self.cfg.norm_eps)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The output projection's result is the logits (no soft-capping or scale)."""
        return logits

    def head(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return linear(self.final_hidden(w, x), w["lm_head"] if "lm_head" in w else w["embed_tokens"])
