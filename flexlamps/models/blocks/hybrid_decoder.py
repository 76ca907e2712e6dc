"""The hybrid decoder forward (Qwen3-Next, Qwen3.5), layer by layer: each layer mixes tokens with
either a gated DeltaNet (over a per-sequence state) or gated full attention (over the KV cache),
then runs a dense SwiGLU MLP or a softmax MoE with a shared expert.

As in `decoder`, weights are handed in and the cache is a callback: a full-attention layer's
`attend(q, k, v)` (the engine's KV cache, built over the full-attention layers only), a DeltaNet
layer's `StateAccess` (the engine's state cache). The MoE is `blocks.moe`'s softmax top-k router
with a sigmoid-gated shared expert. Norms are transformers' zero-centred RMSNorm,
`x * rsqrt(mean(x^2) + eps) * (1 + w)` in fp32, rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.activation import sigmoid, silu
from flexlamps.models.blocks.deltanet_layer import deltanet_mixer
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.rope import rope_cos_sin
from flexlamps.models.blocks.moe import moe_ffn
from flexlamps.models.config import ModelConfig


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3NextRMSNorm: weights stored around zero, applied as (1 + w) in fp32."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


def _rotate_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (n, T, heads, d): its first cos.shape[-1] dims rotated half-split, the rest passed through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    turned = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos + turned * sin, rest), dim=-1)


class HybridForward:
    def __init__(self, cfg: ModelConfig):
        if cfg.hybrid is None:
            raise ValueError(f"HybridForward needs a hybrid config, got model_type {cfg.model_type!r}")
        self.cfg, self.hy = cfg, cfg.hybrid
        r = self.hy.rotary_dim
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))

    def step_context(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin (n, T, 1, rotary_dim) for these positions, shared by the full-attention layers."""
        cos, sin = rope_cos_sin(self.inv_freq, positions, dtype)
        return cos[:, :, None], sin[:, :, None]

    def embed(self, w: dict[str, torch.Tensor], input_ids: torch.Tensor, positions: torch.Tensor):
        return F.embedding(input_ids, w["embed_tokens"])

    def layer(self, w: dict[str, torch.Tensor], x: torch.Tensor, ctx, attend, index: int) -> torch.Tensor:
        """`attend`: the KV cache's callback on a full-attention layer, a StateAccess on a DeltaNet one."""
        eps = self.cfg.norm_eps
        h = offset_rms_norm(x, w["attn_norm"], eps)
        if "A_log" in w:
            x = x + deltanet_mixer(w, h, self.hy, eps, attend)
        else:
            x = x + self._attention(w, h, ctx, attend)
        h = offset_rms_norm(x, w["mlp_norm"], eps)
        if "router" in w:
            return x + moe_ffn(w, h, self.cfg.moe)
        gate = silu(linear(h, w["gate_proj"]), inplace=True)
        return x + linear(linear(h, w["up_proj"], mul=gate), w["down_proj"])

    def _attention(self, w, h: torch.Tensor, ctx, attend) -> torch.Tensor:
        """Gated full attention: q/k RMSNorm per head, partial rotary, output times sigmoid(gate)."""
        cfg, eps = self.cfg, self.cfg.norm_eps
        n, t, _ = h.shape
        d = cfg.head_dim
        q, gate = linear(h, w["q_proj"]).view(n, t, cfg.num_heads, 2 * d).chunk(2, dim=-1)
        q = _rotate_partial(offset_rms_norm(q, w["q_norm"], eps), *ctx)
        k = linear(h, w["k_proj"]).view(n, t, cfg.num_kv_heads, d)
        k = _rotate_partial(offset_rms_norm(k, w["k_norm"], eps), *ctx)
        v = linear(h, w["v_proj"]).view(n, t, cfg.num_kv_heads, d)
        out = attend(q, k, v) * sigmoid(gate.reshape(n, t, cfg.num_heads * d))
        return linear(out, w["o_proj"])

    def final_hidden(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, w["norm"], self.cfg.norm_eps)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The output projection's result is the logits (no soft-capping or scale)."""
        return logits

    def head(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return linear(self.final_hidden(w, x), w["lm_head"] if "lm_head" in w else w["embed_tokens"])
