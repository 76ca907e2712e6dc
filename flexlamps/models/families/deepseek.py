"""DeepSeek-V2 / V3 / V3.2 (MLA, the lightning indexer, MoE): config, weights as data (our names, shapes,
roles) and their HF names.

Roles as in `weight_specs`, plus "router": small 2-D matrices the forward runs in fp32 (the MoE
router, the indexer's head weights), never compressed, as transformers keeps them in fp32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import rms_decoder_fields, rope
from flexlamps.models.families.llama import HF_LAYER as _LLAMA_HF
from flexlamps.models.families.moe_weights import ffn_shapes
from flexlamps.models.mla_config import DEEPSEEK_MODEL_TYPES, mla_from_hf
from flexlamps.models.moe_config import moe_from_hf
from flexlamps.models.weight_specs import WeightSpec, head_specs, layer_spec


def mla_layer_shapes(cfg: ModelConfig, layer: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(local name, shape, role) of one decoder layer's tensors."""
    m, h, heads = cfg.mla, cfg.hidden_size, cfg.num_heads
    out = [("attn_norm", (h,), "norm")]
    if m.q_lora_rank:
        out += [("q_a_proj", (m.q_lora_rank, h), "linear"), ("q_a_norm", (m.q_lora_rank,), "norm"),
                ("q_b_proj", (heads * m.qk_head_dim, m.q_lora_rank), "linear")]
    else:
        out.append(("q_proj", (heads * m.qk_head_dim, h), "linear"))
    out += [
        ("kv_a_proj", (m.latent_width, h), "linear"),
        ("kv_a_norm", (m.kv_lora_rank,), "norm"),
        # sliced per head into W_UK / W_UV by the forward, so never compressed or prepacked
        ("kv_b_proj", (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank), "absorbed"),
        ("o_proj", (h, heads * m.v_head_dim), "linear"),
    ]
    if m.has_indexer:
        d = m.index_head_dim
        out += [("index_q_proj", (m.index_num_heads * d, m.q_lora_rank), "linear"),
                ("index_k_proj", (d, h), "linear"), ("index_k_norm", (d,), "norm"),
                ("index_k_norm_bias", (d,), "bias"), ("index_weights", (m.index_num_heads, h), "router")]
    return out + [("mlp_norm", (h,), "norm")] + ffn_shapes(cfg, layer)


# the norms, q_proj, o_proj and the dense FFN are named as in LLaMA checkpoints
_HF_LAYER = {
    **{k: _LLAMA_HF[k] for k in ("attn_norm", "mlp_norm", "q_proj", "o_proj", "gate_proj", "up_proj", "down_proj")},
    "q_a_proj": "self_attn.q_a_proj.weight",
    "q_a_norm": "self_attn.q_a_layernorm.weight", "q_b_proj": "self_attn.q_b_proj.weight",
    "kv_a_proj": "self_attn.kv_a_proj_with_mqa.weight", "kv_a_norm": "self_attn.kv_a_layernorm.weight",
    "kv_b_proj": "self_attn.kv_b_proj.weight",
    "index_q_proj": "self_attn.indexer.wq_b.weight", "index_k_proj": "self_attn.indexer.wk.weight",
    "index_k_norm": "self_attn.indexer.k_norm.weight", "index_k_norm_bias": "self_attn.indexer.k_norm.bias",
    "index_weights": "self_attn.indexer.weights_proj.weight",
    "router": "mlp.gate.weight", "router_bias": "mlp.gate.e_score_correction_bias",
    "shared_gate_proj": "mlp.shared_experts.gate_proj.weight",
    "shared_up_proj": "mlp.shared_experts.up_proj.weight",
    "shared_down_proj": "mlp.shared_experts.down_proj.weight",
}
_HF_GLOBAL = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}


def mla_hf_name(name: str, layer: int | None, local: str) -> str:
    if layer is None:
        return _HF_GLOBAL[name]
    if local.startswith("experts."):  # experts.{e}.gate_proj -> mlp.experts.{e}.gate_proj.weight
        return f"model.layers.{layer}.mlp.{local}.weight"
    return f"model.layers.{layer}.{_HF_LAYER[local]}"


# DeepSeek-V2's `topk_method` -> our router kind (V3's "noaux_tc" is the sigmoid router)
_V2_ROUTERS = {"greedy": "softmax_greedy", "group_limited_greedy": "softmax_group_limited"}


def _v2_moe(hf: dict[str, Any]):
    """DeepSeek-V2's MoE: softmax scores, greedy or group-limited top-k, never renormalized."""
    method = hf.get("topk_method") or "greedy"
    if method not in _V2_ROUTERS:
        raise UnsupportedModelError(f"topk_method {method!r} is not supported for deepseek_v2 "
                                    f"({', '.join(_V2_ROUTERS)} are)")
    if hf.get("norm_topk_prob"):  # transformers' DeepseekV2 router never renormalizes
        raise UnsupportedModelError("norm_topk_prob=true is not supported for deepseek_v2 (transformers "
                                    "ignores it; released V2 checkpoints set false)")
    if (hf.get("moe_layer_freq") or 1) != 1:
        raise UnsupportedModelError(f"moe_layer_freq={hf['moe_layer_freq']} is not supported (1 is)")
    moe = moe_from_hf(hf)
    return moe and dataclasses.replace(moe, router=_V2_ROUTERS[method], norm_topk_prob=False)


def _from_deepseek(hf: dict[str, Any]) -> ModelConfig:
    for field in ("attention_bias", "mlp_bias"):
        if hf.get(field):
            raise UnsupportedModelError(f"{field}=true is not supported for DeepSeek MLA models "
                                        "(no released checkpoint uses it)")
    theta, scaling = rope(hf, allowed=("linear", "yarn"))
    return ModelConfig(
        arch="mla",
        **rms_decoder_fields(hf),
        num_kv_heads=hf["num_attention_heads"],  # one latent serves every head
        head_dim=hf["qk_rope_head_dim"],  # the rotary width, as transformers sets head_dim
        max_position=hf.get("max_position_embeddings", 4096),
        rope_theta=theta,
        rope_scaling=scaling,
        mla=mla_from_hf(hf, scaling),
        moe=_v2_moe(hf) if hf["model_type"] == "deepseek_v2" else moe_from_hf(hf),
    )


def _mla_specs(cfg: ModelConfig) -> list[WeightSpec]:
    h = cfg.hidden_size
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, h), "embed", None)]
    for i in range(cfg.num_layers):
        specs += [layer_spec(i, local, shape, role) for local, shape, role in mla_layer_shapes(cfg, i)]
    return specs + head_specs(cfg)


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return mla_hf_name(spec.name, spec.layer, spec.local_name)


FAMILY = Family(
    name="deepseek", model_types=tuple(DEEPSEEK_MODEL_TYPES), forward="mla", parse=_from_deepseek,
    weights=_mla_specs, hf_name=hf_name, gguf_architectures=("deepseek2",),
    examples="DeepSeek-V2 / V2-Lite, DeepSeek-V3, DeepSeek-V3.2 (MLA + indexer + MoE)")
