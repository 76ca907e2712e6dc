"""The decoder forward (RMSNorm, rotary GQA attention, gated MLP), layer by layer: the LLaMA-like families.

Functions take the weights they need as arguments, so the engine decides where every tensor
lives; attention is a callback (`attend`) so the engine owns the KV cache. What a family changes
is data on its config (`cfg.attention`, `cfg.decoder`, models/layer_config.py): biases on any
projection (a weight's bias is used when present), q/k norms, Gemma's (1 + w) norms and the
norms around each block (OLMo-2's after each block only), embedding and residual scales, final-logit soft-capping, partial or
no rotation, a rope per layer kind, sliding windows and the attention options (blocks.attention).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.activation import ACTIVATIONS
from flexlamps.models.blocks.attention import AttnOptions
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.moe import moe_ffn
from flexlamps.models.blocks.norms import native_ops, rms_norm, rms_norm_plus_one
from flexlamps.models.blocks.rope import rope_for, rotate_half_split, rotate_interleaved_split, step_tables
from flexlamps.models.config import ModelConfig
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight

# attend(q, k, v, opts=None) with q (n, T, heads, d), k/v (n, T, kv_heads, d) -> (n, T, heads * d); opts: the
# layer's AttnOptions (blocks.attention: scale, soft-capping, sliding window, sinks), which every cache honours
Attend = Callable[..., torch.Tensor]


class DecoderForward:
    # 4-bit projections stacked into one fused-kernel call each (`fuse_weights`; the offload
    # executor stores them stacked): stacked name -> parts, in order. A checkpoint may also
    # ship them stacked (Phi-3): the same names, read as they are.
    FUSED_INT4 = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, cfg: ModelConfig):
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(f"activation {cfg.activation!r} is not supported ({', '.join(ACTIVATIONS)} are)")
        self.cfg, att = cfg, cfg.attention
        self.act = ACTIVATIONS[cfg.activation]
        self.norm = rms_norm_plus_one if cfg.decoder.norm_plus_one else rms_norm
        self.rotary_dim = att.rotary_dim or cfg.head_dim
        self.ropes = {"global": rope_for(self.rotary_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position)}
        if att.local_rope_theta is not None:
            self.ropes["local"] = rope_for(self.rotary_dim, att.local_rope_theta, att.local_rope_scaling,
                                           cfg.max_position)
        # per layer: which rope turns its q and k (None: none), its attention options (sinks added per call)
        self.layer_rope = [None if not att.layer_rotates(i) else "local" if att.layer_local_rope(i) else "global"
                           for i in range(cfg.num_layers)]
        self.options = [AttnOptions(scale=att.scale, softcap=att.softcap, window=att.layer_window(i))
                        for i in range(cfg.num_layers)]

    def step_context(self, positions: torch.Tensor, dtype: torch.dtype):
        """Per-step values shared by all layers: each rope's tables for these positions (`step_tables`)."""
        used = {kind for kind in self.layer_rope if kind is not None}
        return {kind: step_tables(self.ropes[kind], positions, dtype) for kind in used}

    def embed(self, w: dict[str, torch.Tensor], input_ids: torch.Tensor, positions: torch.Tensor):
        x = F.embedding(input_ids, w["embed_tokens"])
        dec = self.cfg.decoder
        if dec.embed_scale is None:
            return x
        if dec.embed_scale_rounded:  # Gemma: the scale as a tensor of the weights' dtype
            return x * torch.tensor(dec.embed_scale, dtype=x.dtype)
        return x * dec.embed_scale

    def fuse_weights(self, w: dict) -> dict:
        """One layer's weights with 4-bit (or all 8-bit) q/k/v and gate/up stacked (`qkv_proj`,
        `gate_up_proj`): fewer, larger fused-kernel calls (SmolLM2 decode: ~60 us less per layer).
        Dense weights, and parts of different kinds, stay apart, so the float paths keep their
        exact results."""
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

    def _qkv(self, w, h):
        """q, k, v as (n, T, heads, head_dim) views, and q and k as one view when one stacked
        projection made them (None otherwise)."""
        cfg = self.cfg
        n, t, _ = h.shape
        heads, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        if "qkv_proj" in w:  # narrow: one op where a slice of the third dim is three
            qkv = linear(h, w["qkv_proj"], w.get("qkv_bias")).view(n, t, heads + 2 * kv, d)
            qk = qkv.narrow(2, 0, heads + kv)
            return qk.narrow(2, 0, heads), qk.narrow(2, heads, kv), qkv.narrow(2, heads + kv, kv), qk
        q, k, v = (linear(h, w[f"{p}_proj"], w.get(f"{p}_bias")) for p in "qkv")
        return q.view(n, t, heads, d), k.view(n, t, kv, d), v.view(n, t, kv, d), None

    def _qk_normed(self, w, x: torch.Tensor, norm: str = "q_norm") -> torch.Tensor:
        """Each head's q (k) RMS-normed, or all heads' at once (OLMoE: `qk_norm_full`)."""
        if self.cfg.attention.qk_norm_full:
            return self.norm(x.flatten(2), w[norm], self.cfg.norm_eps).view(x.shape)
        return self.norm(x, w[norm], self.cfg.norm_eps)

    def _rotated_qkv(self, w, h, ctx, index: int):
        """q, k (normed per head where the family does, then rotated) and v; a stacked projection's
        q and k are rotated in one pass (views of one tensor)."""
        q, k, v, qk = self._qkv(w, h)
        if self.cfg.attention.qk_norm:
            q, k, qk = self._qk_normed(w, q), self._qk_normed(w, k, "k_norm"), None
        kind = self.layer_rope[index]
        if kind is None:
            return q, k, v
        tables, r = ctx[kind], self.rotary_dim
        if self.cfg.attention.rope_interleaved:
            return _rotate(q, tables, r, rotate_interleaved_split), _rotate(k, tables, r, rotate_interleaved_split), v
        if qk is not None and r == self.cfg.head_dim:
            qk = rotate_half_split(qk, *tables)
            return qk.narrow(2, 0, q.shape[2]), qk.narrow(2, q.shape[2], k.shape[2]), v
        return _rotate(q, tables, r), _rotate(k, tables, r), v

    def attention_block(self, w, x, ctx, attend: Attend, index: int) -> torch.Tensor:
        """The attention's contribution to the residual stream (before the residual scale)."""
        q, k, v = self._rotated_qkv(w, self._pre_norm(x, w, "attn_norm"), ctx, index)
        opts = self.options[index]
        if "sinks" in w:  # gpt-oss: a weight of the layer
            opts = dataclasses.replace(opts, sinks=w["sinks"])
        return attend(q, k, v, opts)

    def mlp(self, w, h: torch.Tensor) -> torch.Tensor:
        """The FFN (no residual): act(gate(h)) * up(h), then down; or a MoE layer's experts."""
        if "router" in w:
            return moe_ffn(w, h, self.cfg.moe)
        return linear(self._mlp_product(w, h), w["down_proj"], w.get("down_bias"))

    def _mlp_product(self, w, h):
        """act(gate(h)) * up(h) (with SiLU the product rides on the up GEMM, fused in fp32; see models.linear)."""
        if "gate_up_proj" in w:
            gate_up = linear(h, w["gate_up_proj"], w.get("gate_up_bias"))
            ops = native_ops() if gate_up.dtype != torch.float32 and self.cfg.activation == "silu" else None
            if ops is not None and ops.takes(gate_up):
                return ops.silu_mul(gate_up)
            half = gate_up.shape[-1] // 2
            return self.act(gate_up.narrow(-1, 0, half)) * gate_up.narrow(-1, half, half)
        gate = self.act(linear(h, w["gate_proj"], w.get("gate_bias")), inplace=True)
        return linear(h, w["up_proj"], w.get("up_bias"), mul=gate)

    def layer(self, w: dict[str, torch.Tensor], x: torch.Tensor, ctx, attend: Attend, index: int) -> torch.Tensor:
        """Decoder layer `index` (its weights `w`) over hidden states x (n, T, hidden)."""
        dec = self.cfg.decoder
        attn = self.attention_block(w, x, ctx, attend, index)
        if dec.sandwich_norms or dec.residual_scale != 1.0:
            x = x + self._branch(linear(attn, w["o_proj"], w.get("o_bias")), w, "post_attn_norm")
            h = self.mlp(w, self._pre_norm(x, w, "mlp_norm"))
            return x + self._branch(h, w, "post_mlp_norm")
        # the residual adds ride on the GEMMs (fused in fp32; see models.linear)
        x = linear(attn, w["o_proj"], w.get("o_bias"), add=x)
        h = self._pre_norm(x, w, "mlp_norm")
        if "router" in w:
            return x + moe_ffn(w, h, self.cfg.moe)
        return linear(self._mlp_product(w, h), w["down_proj"], w.get("down_bias"), add=x)

    def _pre_norm(self, x: torch.Tensor, w, norm: str) -> torch.Tensor:
        """What a block reads: the residual normed, or as it is where the family norms only after (OLMo-2)."""
        return self.norm(x, w[norm], self.cfg.norm_eps) if self.cfg.decoder.pre_norms else x

    def _branch(self, out: torch.Tensor, w, post_norm: str) -> torch.Tensor:
        """A block's output as it joins the residual: normed after (Gemma), scaled (Granite)."""
        dec = self.cfg.decoder
        if dec.sandwich_norms:
            out = self.norm(out, w[post_norm], self.cfg.norm_eps)
        return out * dec.residual_scale if dec.residual_scale != 1.0 else out

    def final_hidden(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """What the output projection reads (the engine may apply that projection in chunks)."""
        return self.norm(x, w["norm"], self.cfg.norm_eps)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The output projection's result as the model's logits: soft-capped (Gemma-2) or divided
        (Granite) in fp32, whichever engine computed the projection."""
        dec = self.cfg.decoder
        if dec.logit_softcap is None and dec.logit_divisor == 1.0:
            return logits
        logits = logits.float()
        if dec.logit_divisor != 1.0:
            logits = logits / dec.logit_divisor
        if dec.logit_softcap is not None:
            logits = logits.div_(dec.logit_softcap).tanh_().mul_(dec.logit_softcap)
        return logits

    def head(self, w: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        logits = linear(self.final_hidden(w, x), w["lm_head"] if "lm_head" in w else w["embed_tokens"])
        return self.finish_logits(logits)


def _rotate(x: torch.Tensor, tables, rotary_dim: int, rotate=rotate_half_split) -> torch.Tensor:
    """x (n, T, heads, d) with its first `rotary_dim` dims rotated (all of them: one op chain)."""
    if rotary_dim == x.shape[-1]:
        return rotate(x, *tables)
    return torch.cat([rotate(x[..., :rotary_dim], *tables), x[..., rotary_dim:]], dim=-1)
