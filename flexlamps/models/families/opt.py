"""OPT (FlexGen's model family)."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import eos_ids
from flexlamps.models.weight_specs import WeightSpec, layer_spec


def _from_opt(hf: dict[str, Any]) -> ModelConfig:
    hidden = hf["hidden_size"]
    heads = hf["num_attention_heads"]
    proj = hf.get("word_embed_proj_dim", hidden)
    return ModelConfig(
        arch="opt",
        model_type="opt",
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=hf["ffn_dim"],
        max_position=hf.get("max_position_embeddings", 2048),
        norm_eps=1e-5,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        qkv_bias=bool(hf.get("enable_bias", True)),
        mlp_bias=bool(hf.get("enable_bias", True)),
        do_layer_norm_before=bool(hf.get("do_layer_norm_before", True)),
        word_embed_proj_dim=proj if proj != hidden else None,
        activation=hf.get("activation_function", "relu"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids(hf),
    )


def _opt_specs(cfg: ModelConfig) -> list[WeightSpec]:
    h, f = cfg.hidden_size, cfg.intermediate_size
    e = cfg.word_embed_proj_dim or h
    specs = [
        WeightSpec("embed_tokens", (cfg.vocab_size, e), "embed", None),
        # OPT's learned positions are offset by 2 (a fairseq legacy), hence the 2 extra rows.
        WeightSpec("embed_positions", (cfg.max_position + 2, h), "embed", None),
    ]
    if cfg.word_embed_proj_dim:
        specs.append(WeightSpec("project_in", (h, e), "linear", None))
    for i in range(cfg.num_layers):
        specs += [layer_spec(i, "attn_norm", (h,), "norm"), layer_spec(i, "attn_norm_bias", (h,), "bias")]
        for p in ("q", "k", "v", "o"):
            specs.append(layer_spec(i, f"{p}_proj", (h, h), "linear"))
            if cfg.qkv_bias:
                specs.append(layer_spec(i, f"{p}_bias", (h,), "bias"))
        specs += [layer_spec(i, "mlp_norm", (h,), "norm"), layer_spec(i, "mlp_norm_bias", (h,), "bias"),
                  layer_spec(i, "fc1", (f, h), "linear")]
        if cfg.mlp_bias:
            specs.append(layer_spec(i, "fc1_bias", (f,), "bias"))
        specs.append(layer_spec(i, "fc2", (h, f), "linear"))
        if cfg.mlp_bias:
            specs.append(layer_spec(i, "fc2_bias", (h,), "bias"))
    if cfg.do_layer_norm_before:
        specs += [WeightSpec("norm", (h,), "norm", None), WeightSpec("norm_bias", (h,), "bias", None)]
    if cfg.word_embed_proj_dim:
        specs.append(WeightSpec("project_out", (e, h), "linear", None))
    if not cfg.tie_word_embeddings:
        specs.append(WeightSpec("lm_head", (cfg.vocab_size, e), "embed", None))
    return specs


HF_LAYER = {
    "attn_norm": "self_attn_layer_norm.weight", "attn_norm_bias": "self_attn_layer_norm.bias",
    "q_proj": "self_attn.q_proj.weight", "q_bias": "self_attn.q_proj.bias",
    "k_proj": "self_attn.k_proj.weight", "k_bias": "self_attn.k_proj.bias",
    "v_proj": "self_attn.v_proj.weight", "v_bias": "self_attn.v_proj.bias",
    "o_proj": "self_attn.out_proj.weight", "o_bias": "self_attn.out_proj.bias",
    "mlp_norm": "final_layer_norm.weight", "mlp_norm_bias": "final_layer_norm.bias",
    "fc1": "fc1.weight", "fc1_bias": "fc1.bias", "fc2": "fc2.weight", "fc2_bias": "fc2.bias",
}
HF_GLOBAL = {
    "embed_tokens": "model.decoder.embed_tokens.weight", "embed_positions": "model.decoder.embed_positions.weight",
    "project_in": "model.decoder.project_in.weight", "project_out": "model.decoder.project_out.weight",
    "norm": "model.decoder.final_layer_norm.weight", "norm_bias": "model.decoder.final_layer_norm.bias",
    "lm_head": "lm_head.weight",
}


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    if spec.layer is None:
        return HF_GLOBAL[spec.name]
    return f"model.decoder.layers.{spec.layer}.{HF_LAYER[spec.local_name]}"


FAMILY = Family(name="opt", model_types=("opt",), forward="opt", parse=_from_opt, weights=_opt_specs,
                hf_name=hf_name, examples="OPT-125M ... OPT-66B (FlexGen's models)")
