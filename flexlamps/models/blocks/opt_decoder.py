"""OPT forward (FlexGen's model family), layer by layer, in the same shape as `llama.py`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.activation import silu
from flexlamps.models.config import ModelConfig
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.decoder import Attend

# OPT's learned position table is offset by 2 rows (fairseq's padding legacy).
POSITION_OFFSET = 2

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": silu}


class OptForward:
    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        if cfg.activation not in _ACTIVATIONS:
            raise ValueError(f"OPT activation {cfg.activation!r} is not supported ({', '.join(_ACTIVATIONS)})")
        self.act = _ACTIVATIONS[cfg.activation]

    def step_context(self, positions: torch.Tensor, dtype: torch.dtype):
        return None

    def embed(self, w, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = F.embedding(input_ids, w["embed_tokens"])
        if "project_in" in w:
            x = linear(x, w["project_in"])
        return x + F.embedding(positions + POSITION_OFFSET, w["embed_positions"])

    def _norm(self, x, w, name):
        return F.layer_norm(x, (x.shape[-1],), w[name], w[name + "_bias"], self.cfg.norm_eps)

    def layer(self, w, x: torch.Tensor, ctx, attend: Attend, index: int) -> torch.Tensor:
        cfg = self.cfg
        n, t, _ = x.shape
        pre = cfg.do_layer_norm_before
        h = self._norm(x, w, "attn_norm") if pre else x
        q = linear(h, w["q_proj"], w.get("q_bias")).view(n, t, cfg.num_heads, cfg.head_dim)
        k = linear(h, w["k_proj"], w.get("k_bias")).view(n, t, cfg.num_heads, cfg.head_dim)
        v = linear(h, w["v_proj"], w.get("v_bias")).view(n, t, cfg.num_heads, cfg.head_dim)
        x = linear(attend(q, k, v), w["o_proj"], w.get("o_bias"), add=x)
        if not pre:
            x = self._norm(x, w, "attn_norm")
        h = self._norm(x, w, "mlp_norm") if pre else x
        x = linear(self.act(linear(h, w["fc1"], w.get("fc1_bias"))), w["fc2"], w.get("fc2_bias"), add=x)
        return x if pre else self._norm(x, w, "mlp_norm")

    def final_hidden(self, w, x: torch.Tensor) -> torch.Tensor:
        if "norm" in w:
            x = self._norm(x, w, "norm")
        if "project_out" in w:
            x = linear(x, w["project_out"])
        return x

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The output projection's result is the logits (no soft-capping or scale)."""
        return logits

    def head(self, w, x: torch.Tensor) -> torch.Tensor:
        return linear(self.final_hidden(w, x), w["lm_head"] if "lm_head" in w else w["embed_tokens"])
