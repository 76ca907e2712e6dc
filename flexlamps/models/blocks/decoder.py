"""The decoder forward (RMSNorm, rotary GQA attention, SwiGLU MLP), layer by layer: the LLaMA-like families.

Functions take the weights they need as arguments, so the engine decides where every tensor
lives; attention is a callback (`attend`) so the engine owns the KV cache.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.activation import silu
from flexlamps.models.blocks.norms import rms_norm
from flexlamps.models.config import ModelConfig
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.moe import moe_ffn
from flexlamps.models.blocks.norms import native_ops
from flexlamps.models.blocks.rope import inverse_frequencies, rope_tables, rotate_half_split

# attend(q, k, v, opts=None) with q (n, T, heads, d), k/v (n, T, kv_heads, d) -> (n, T, heads * d); opts: the
# layer's AttnOptions (blocks.attention: scale, soft-capping, sliding window, sinks), which every cache honours
Attend = Callable[..., torch.Tensor]


class DecoderForward:
    # 4-bit projections stacked into one fused-kernel call each (`fuse_weights`; the offload
    # executor stores them stacked): stacked name -> parts, in order
    FUSED_INT4 = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.inv_freq = inverse_frequencies(cfg)

    def step_context(self, positions: torch.Tensor, dtype: torch.dtype):
        """Per-step values shared by all layers: the RoPE tables for these positions (`rope_tables`)."""
        return rope_tables(self.inv_freq, positions, dtype)

    def embed(self, w: dict[str, torch.Tensor], input_ids: torch.Tensor, positions: torch.Tensor):
        return F.embedding(input_ids, w["embed_tokens"])

    def fuse_weights(self, w: dict) -> dict:
        """One layer's weights with 4-bit (or all 8-bit) q/k/v and gate/up stacked (`qkv_proj`,
        `gate_up_proj`): fewer, larger fused-kernel calls (SmolLM2 decode: ~60 us less per layer).
        Dense weights, and parts of different kinds, stay apart, so the float paths keep their
        exact results."""
        from quant.int4_weight import Int4Weight
        from quant.int8_weight import Int8Weight

        out = dict(w)
        for fused, parts in self.FUSED_INT4.items():
            biases = [part.replace("_proj", "_bias") for part in parts]
            with_bias = [b in w for b in biases]
            kinds = {type(w.get(part)) for part in parts}
            if len(kinds) == 1 and kinds <= {Int4Weight, Int8Weight} and len(set(with_bias)) == 1:
                out[fused] = kinds.pop().cat([out.pop(part) for part in parts])
                if with_bias[0]:
                    out[fused.replace("_proj", "_bias")] = torch.cat([out.pop(b) for b in biases])
        return out

    def _rotated_qkv(self, w, h, ctx):
        """q, k (rotated) and v as (n, T, heads, head_dim); a stacked projection's q and k are
        rotated in one pass (views of one tensor)."""
        cfg = self.cfg
        n, t, _ = h.shape
        heads, kv = cfg.num_heads, cfg.num_kv_heads
        if "qkv_proj" in w:  # narrow: one op where a slice of the third dim is three
            qkv = linear(h, w["qkv_proj"], w.get("qkv_bias")).view(n, t, heads + 2 * kv, cfg.head_dim)
            qk = rotate_half_split(qkv.narrow(2, 0, heads + kv), *ctx)
            return qk.narrow(2, 0, heads), qk.narrow(2, heads, kv), qkv.narrow(2, heads + kv, kv)
        q, k, v = (linear(h, w[f"{p}_proj"], w.get(f"{p}_bias")) for p in "qkv")
        return (rotate_half_split(q.view(n, t, heads, cfg.head_dim), *ctx),
                rotate_half_split(k.view(n, t, kv, cfg.head_dim), *ctx), v.view(n, t, kv, cfg.head_dim))

    def _mlp_product(self, w, h):
        """silu(gate(h)) * up(h) (the product rides on the up GEMM, fused in fp32; see models.linear)."""
        if "gate_up_proj" in w:
            gate_up = linear(h, w["gate_up_proj"], w.get("gate_up_bias"))
            ops = native_ops() if gate_up.dtype != torch.float32 else None
            if ops is not None and ops.takes(gate_up):
                return ops.silu_mul(gate_up)
            half = gate_up.shape[-1] // 2
            return silu(gate_up.narrow(-1, 0, half)) * gate_up.narrow(-1, half, half)
        gate = silu(linear(h, w["gate_proj"], w.get("gate_bias")), inplace=True)
        return linear(h, w["up_proj"], w.get("up_bias"), mul=gate)

    def layer(self, w: dict[str, torch.Tensor], x: torch.Tensor, ctx, attend: Attend, index: int) -> torch.Tensor:
        """Decoder layer `index` (its weights `w`) over hidden states x (n, T, hidden)."""
        cfg = self.cfg
        q, k, v = self._rotated_qkv(w, rms_norm(x, w["attn_norm"], cfg.norm_eps), ctx)
        # the residual adds ride on the GEMMs (fused in fp32; see models.linear)
        x = linear(attend(q, k, v), w["o_proj"], add=x)
        h = rms_norm(x, w["mlp_norm"], cfg.norm_eps)
        if "router" in w:
            return x + moe_ffn(w, h, cfg.moe)
        return linear(self._mlp_product(w, h), w["down_proj"], w.get("down_bias"), add=x)

    def final_hidden(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """What the output projection reads (the engine may apply that projection in chunks)."""
        return rms_norm(x, w["norm"], self.cfg.norm_eps)

    def head(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return linear(self.final_hidden(w, x), w["lm_head"] if "lm_head" in w else w["embed_tokens"])
