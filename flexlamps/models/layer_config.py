"""`AttentionConfig` and `DecoderConfig`: how a family's decoder layer departs from LLaMA's.

Torch-free data on `ModelConfig` (its `attention` and `decoder` fields), read by the decoder
block (blocks/decoder.py), the weight lists and the planner. Defaults are LLaMA's: every option
off, so a family sets only what its config.json says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    scale: float | None = None  # softmax scale; None: head_dim ** -0.5 (gemma: query_pre_attn_scalar ** -0.5)
    softcap: float | None = None  # tanh soft-capping of the scores (gemma2 attn_logit_softcapping)
    window: int | None = None  # sliding window: a query at p sees keys p-window+1..p
    window_layers: tuple[bool, ...] = ()  # which layers slide; () with a window: every layer
    sinks: bool = False  # a learned logit per head in the softmax's denominator (gpt-oss)
    qk_norm: bool = False  # RMSNorm of each head's q and k before the rotation (qwen3, gemma3)
    qk_norm_full: bool = False  # with qk_norm: over all heads' q (k) at once, before the head split (OLMoE)
    o_bias: bool = False  # a bias on the output projection (llama attention_bias)
    rotary_dim: int | None = None  # partial rotary: the leading dims of each head rotated; None: all
    rope_interleaved: bool = False  # rotary pairs (x0, x1), (x2, x3), ... rather than the halves (ERNIE-4.5)
    rope_layers: tuple[bool, ...] = ()  # which layers rotate; (): every layer (smollm3's no_rope_layers)
    # the local layers' own rope (gemma3's sliding layers: rope_local_base_freq); None: the model's
    local_rope_theta: float | None = None
    local_rope_scaling: dict[str, Any] | None = None
    local_rope_layers: tuple[bool, ...] = ()  # which layers turn with it

    def layer_window(self, layer: int) -> int | None:
        if self.window is None or (self.window_layers and not self.window_layers[layer]):
            return None
        return self.window

    def layer_rotates(self, layer: int) -> bool:
        return not self.rope_layers or self.rope_layers[layer]

    def layer_local_rope(self, layer: int) -> bool:
        """Whether the layer rotates with the local rope (Gemma-3's sliding layers)."""
        return self.local_rope_theta is not None and bool(self.local_rope_layers) and self.local_rope_layers[layer]


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    norm_plus_one: bool = False  # RMSNorm scales by (1 + w), in fp32 before rounding (gemma)
    sandwich_norms: bool = False  # norms after attention and around the MLP too (gemma2/3)
    pre_norms: bool = True  # a norm before attention and before the MLP; False: only the ones after (olmo2)
    embed_scale: float | None = None  # embeddings times this (gemma: sqrt(hidden); granite's multiplier)
    embed_scale_rounded: bool = False  # the scale rounded to the weights' dtype first (gemma)
    residual_scale: float = 1.0  # each block's output times this before the residual add (granite)
    logit_softcap: float | None = None  # final logits -> softcap * tanh(logits / softcap) (gemma2)
    logit_divisor: float = 1.0  # final logits divided by this (granite logits_scaling)


def from_dict(cls, d: dict[str, Any] | None):
    """`cls` from its `dataclasses.asdict` form (tuples restored)."""
    if d is None:
        return cls()
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


# the rope types the decoder computes (transformers' names; "default" is none): blocks/rope.py
ROPE_TYPES = ("linear", "llama3", "yarn", "longrope")
# the fields each needs in its parameters (yarn's factor may come from the context lengths)
ROPE_FIELDS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                 "original_max_position_embeddings"),
               "yarn": ("original_max_position_embeddings",),
               "longrope": ("short_factor", "long_factor", "original_max_position_embeddings")}
