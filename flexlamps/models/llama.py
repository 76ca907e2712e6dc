"""LLaMA-family forward, layer by layer: LLaMA-2/3, Mistral (full attention), Qwen2, SmolLM2, TinyLlama.

Functions take the weights they need as arguments, so the engine decides where every tensor
lives; attention is a callback (`attend`) so the engine owns the KV cache.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from flexlamps.models.config import ModelConfig
from flexlamps.models.linear import linear
from flexlamps.models.rope import apply_rope, inverse_frequencies, rope_cos_sin

# attend(q, k, v) with q (n, T, heads, d), k/v (n, T, kv_heads, d) -> (n, T, heads * d)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # The reference normalizes in fp32, casts back, then scales; torch's fused kernel gives
    # the same bits in one pass (in fp32 with the scale folded in).
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    return weight * F.rms_norm(x.float(), x.shape[-1:], None, eps).to(x.dtype)


class LlamaForward:
    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.inv_freq = inverse_frequencies(cfg)

    def step_context(self, positions: torch.Tensor, dtype: torch.dtype):
        """Per-step values shared by all layers: the RoPE cos/sin for these positions."""
        return rope_cos_sin(self.inv_freq, positions, dtype)

    def embed(self, w: dict[str, torch.Tensor], input_ids: torch.Tensor, positions: torch.Tensor):
        return F.embedding(input_ids, w["embed_tokens"])

    def layer(self, w: dict[str, torch.Tensor], x: torch.Tensor, ctx, attend: Attend) -> torch.Tensor:
        cfg = self.cfg
        n, t, _ = x.shape
        cos, sin = ctx
        h = rms_norm(x, w["attn_norm"], cfg.norm_eps)
        q = linear(h, w["q_proj"], w.get("q_bias")).view(n, t, cfg.num_heads, cfg.head_dim)
        k = linear(h, w["k_proj"], w.get("k_bias")).view(n, t, cfg.num_kv_heads, cfg.head_dim)
        v = linear(h, w["v_proj"], w.get("v_bias")).view(n, t, cfg.num_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # residual adds and the gate product ride on the GEMMs (fused in fp32; see models.linear)
        x = linear(attend(q, k, v), w["o_proj"], add=x)
        h = rms_norm(x, w["mlp_norm"], cfg.norm_eps)
        gate = F.silu(linear(h, w["gate_proj"], w.get("gate_bias")), inplace=True)
        prod = linear(h, w["up_proj"], w.get("up_bias"), mul=gate)
        return linear(prod, w["down_proj"], w.get("down_bias"), add=x)

    def final_hidden(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """What the output projection reads (the engine may apply that projection in chunks)."""
        return rms_norm(x, w["norm"], self.cfg.norm_eps)

    def head(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return linear(self.final_hidden(w, x), w["lm_head"] if "lm_head" in w else w["embed_tokens"])
