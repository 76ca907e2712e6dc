"""The weights of a `DecoderForward` model (blocks/decoder.py) as data, and their checkpoint names:
shared by every family built on that block (torch-free).

Which tensors a layer has follows its config: biases (q/k/v, o, the MLP), q/k norms, sinks, the
norms after attention and around the MLP (Gemma), only the ones after (OLMo-2), a stacked q/k/v and
gate/up as Phi-3 ships them.
A family passes its own FFN (`ffn`: the MoE families' experts) and its own checkpoint names where
they differ from LLaMA's (`hf_layer_names`).
"""

from __future__ import annotations

from typing import Callable

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.moe_weights import Shapes, ffn_shapes
from flexlamps.models.weight_specs import WeightSpec, head_specs, layer_spec

# our local name -> the name under `model.layers.{i}.` in a LLaMA-layout checkpoint
HF_LAYER = {
    "attn_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "qkv_proj": "self_attn.qkv_proj.weight", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "sinks": "self_attn.sinks",
    "o_proj": "self_attn.o_proj.weight", "o_bias": "self_attn.o_proj.bias",
    "mlp_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
    "gate_bias": "mlp.gate_proj.bias", "up_bias": "mlp.up_proj.bias", "down_bias": "mlp.down_proj.bias",
    "gate_up_proj": "mlp.gate_up_proj.weight",
}
# Gemma-2/3: a norm after attention and one on each side of the MLP
SANDWICH_HF_LAYER = {
    "post_attn_norm": "post_attention_layernorm.weight", "mlp_norm": "pre_feedforward_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
}
HF_GLOBAL = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}


def attention_shapes(cfg: ModelConfig, stacked: bool = False) -> Shapes:
    """The input norm (where the family has one) and attention of one layer; `stacked`: q/k/v as
    one matrix (Phi-3)."""
    h, q, kv, d, att = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.head_dim, cfg.attention
    out: Shapes = [("attn_norm", (h,), "norm")] if cfg.decoder.pre_norms else []
    if stacked:
        out.append(("qkv_proj", (q + 2 * kv, h), "linear"))
    else:
        out += [("q_proj", (q, h), "linear"), ("k_proj", (kv, h), "linear"), ("v_proj", (kv, h), "linear")]
    if cfg.qkv_bias:
        out += [("q_bias", (q,), "bias"), ("k_bias", (kv,), "bias"), ("v_bias", (kv,), "bias")]
    if att.qk_norm:  # per head, or over the whole projection (OLMoE)
        q_norm, k_norm = (q, kv) if att.qk_norm_full else (d, d)
        out += [("q_norm", (q_norm,), "norm"), ("k_norm", (k_norm,), "norm")]
    if att.sinks:
        out.append(("sinks", (cfg.num_heads,), "bias"))
    out.append(("o_proj", (h, q), "linear"))
    if att.o_bias:
        out.append(("o_bias", (h,), "bias"))
    if cfg.decoder.sandwich_norms:
        out.append(("post_attn_norm", (h,), "norm"))
    return out


def stacked_mlp_shapes(cfg: ModelConfig, layer: int) -> Shapes:
    """The gated MLP of one layer with gate and up stacked in one matrix (Phi-3), no biases."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    return [("gate_up_proj", (2 * f, h), "linear"), ("down_proj", (h, f), "linear")]


def decoder_specs(cfg: ModelConfig, ffn: Callable[[ModelConfig, int], Shapes] = ffn_shapes,
                  stacked: bool = False) -> list[WeightSpec]:
    """Every tensor of the model: embedding, each layer (attention, the FFN's norm, `ffn`: the dense
    gated MLP or the MoE, moe_weights.ffn_shapes), head; `stacked`: Phi-3's stacked q/k/v and gate/up."""
    h = cfg.hidden_size
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, h), "embed", None)]
    for i in range(cfg.num_layers):
        shapes = attention_shapes(cfg, stacked) + ([("mlp_norm", (h,), "norm")] if cfg.decoder.pre_norms else [])
        shapes += stacked_mlp_shapes(cfg, i) if stacked else ffn(cfg, i)
        if cfg.decoder.sandwich_norms:
            shapes.append(("post_mlp_norm", (h,), "norm"))
        specs += [layer_spec(i, local, shape, role) for local, shape, role in shapes]
    return specs + head_specs(cfg)


def decoder_hf_name(spec: WeightSpec, moe_name: Callable[[str], str | None] | None = None,
                    layer_names: dict[str, str] = HF_LAYER) -> str:
    """`spec`'s name in a LLaMA-layout checkpoint; `moe_name` names the MoE tensors of the family's
    layout (moe_weights), `layer_names` a family's own names of the others."""
    if spec.layer is None:
        return HF_GLOBAL[spec.name]
    local = spec.local_name
    name = moe_name(local) if moe_name is not None else None
    return f"model.layers.{spec.layer}.{name or layer_names[local]}"
