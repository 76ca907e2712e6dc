"""Weights described as data: every tensor an architecture needs, with its shape and role.

The planner sizes a model from this list, the offload store places it, and the loaders map
checkpoint names onto it, all without running the model. Names are ours ("layers.3.q_proj");
`hf_name` gives the Hugging Face checkpoint name of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexlamps.models.config import ModelConfig

# role: "linear" (2-D matmul weight, compressible), "embed", "norm", "bias"
@dataclass(frozen=True)
class WeightSpec:
    name: str
    shape: tuple[int, ...]
    role: str
    layer: int | None  # None for the embedding / head tensors

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def local_name(self) -> str:
        """Name inside its layer ("q_proj"), or the full name for non-layer tensors."""
        return self.name.split(".", 2)[2] if self.layer is not None else self.name


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    if cfg.arch == "mla":
        return _mla_specs(cfg)
    return _llama_specs(cfg) if cfg.arch == "llama" else _opt_specs(cfg)


def layer_specs(cfg: ModelConfig, layer: int) -> list[WeightSpec]:
    return [s for s in weight_specs(cfg) if s.layer == layer]


def total_bytes(cfg: ModelConfig, dtype_bytes: int) -> int:
    return sum(s.numel for s in weight_specs(cfg)) * dtype_bytes


def _layer(i: int, local: str, shape: tuple[int, ...], role: str) -> WeightSpec:
    return WeightSpec(f"layers.{i}.{local}", shape, role, i)


def _llama_specs(cfg: ModelConfig) -> list[WeightSpec]:
    h, q, kv, f = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, h), "embed", None)]
    for i in range(cfg.num_layers):
        specs += [
            _layer(i, "attn_norm", (h,), "norm"),
            _layer(i, "q_proj", (q, h), "linear"),
            _layer(i, "k_proj", (kv, h), "linear"),
            _layer(i, "v_proj", (kv, h), "linear"),
        ]
        if cfg.qkv_bias:
            specs += [_layer(i, "q_bias", (q,), "bias"), _layer(i, "k_bias", (kv,), "bias"),
                      _layer(i, "v_bias", (kv,), "bias")]
        specs += [
            _layer(i, "o_proj", (h, q), "linear"),
            _layer(i, "mlp_norm", (h,), "norm"),
            _layer(i, "gate_proj", (f, h), "linear"),
            _layer(i, "up_proj", (f, h), "linear"),
            _layer(i, "down_proj", (h, f), "linear"),
        ]
        if cfg.mlp_bias:
            specs += [_layer(i, "gate_bias", (f,), "bias"), _layer(i, "up_bias", (f,), "bias"),
                      _layer(i, "down_bias", (h,), "bias")]
    specs.append(WeightSpec("norm", (h,), "norm", None))
    if not cfg.tie_word_embeddings:
        specs.append(WeightSpec("lm_head", (cfg.vocab_size, h), "embed", None))
    return specs


def _mla_specs(cfg: ModelConfig) -> list[WeightSpec]:
    from flexlamps.models.families.deepseek_weights import mla_layer_shapes

    h = cfg.hidden_size
    specs = [WeightSpec("embed_tokens", (cfg.vocab_size, h), "embed", None)]
    for i in range(cfg.num_layers):
        specs += [_layer(i, local, shape, role) for local, shape, role in mla_layer_shapes(cfg, i)]
    specs.append(WeightSpec("norm", (h,), "norm", None))
    if not cfg.tie_word_embeddings:
        specs.append(WeightSpec("lm_head", (cfg.vocab_size, h), "embed", None))
    return specs


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
        specs += [_layer(i, "attn_norm", (h,), "norm"), _layer(i, "attn_norm_bias", (h,), "bias")]
        for p in ("q", "k", "v", "o"):
            specs.append(_layer(i, f"{p}_proj", (h, h), "linear"))
            if cfg.qkv_bias:
                specs.append(_layer(i, f"{p}_bias", (h,), "bias"))
        specs += [_layer(i, "mlp_norm", (h,), "norm"), _layer(i, "mlp_norm_bias", (h,), "bias"),
                  _layer(i, "fc1", (f, h), "linear")]
        if cfg.mlp_bias:
            specs.append(_layer(i, "fc1_bias", (f,), "bias"))
        specs.append(_layer(i, "fc2", (h, f), "linear"))
        if cfg.mlp_bias:
            specs.append(_layer(i, "fc2_bias", (h,), "bias"))
    if cfg.do_layer_norm_before:
        specs += [WeightSpec("norm", (h,), "norm", None), WeightSpec("norm_bias", (h,), "bias", None)]
    if cfg.word_embed_proj_dim:
        specs.append(WeightSpec("project_out", (e, h), "linear", None))
    if not cfg.tie_word_embeddings:
        specs.append(WeightSpec("lm_head", (cfg.vocab_size, e), "embed", None))
    return specs


_LLAMA_HF = {
    "attn_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight", "v_proj": "self_attn.v_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
    "o_proj": "self_attn.o_proj.weight", "mlp_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
    "gate_bias": "mlp.gate_proj.bias", "up_bias": "mlp.up_proj.bias", "down_bias": "mlp.down_proj.bias",
}
_OPT_HF = {
    "attn_norm": "self_attn_layer_norm.weight", "attn_norm_bias": "self_attn_layer_norm.bias",
    "q_proj": "self_attn.q_proj.weight", "q_bias": "self_attn.q_proj.bias",
    "k_proj": "self_attn.k_proj.weight", "k_bias": "self_attn.k_proj.bias",
    "v_proj": "self_attn.v_proj.weight", "v_bias": "self_attn.v_proj.bias",
    "o_proj": "self_attn.out_proj.weight", "o_bias": "self_attn.out_proj.bias",
    "mlp_norm": "final_layer_norm.weight", "mlp_norm_bias": "final_layer_norm.bias",
    "fc1": "fc1.weight", "fc1_bias": "fc1.bias", "fc2": "fc2.weight", "fc2_bias": "fc2.bias",
}
_LLAMA_HF_GLOBAL = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight",
                    "lm_head": "lm_head.weight"}
_OPT_HF_GLOBAL = {
    "embed_tokens": "model.decoder.embed_tokens.weight", "embed_positions": "model.decoder.embed_positions.weight",
    "project_in": "model.decoder.project_in.weight", "project_out": "model.decoder.project_out.weight",
    "norm": "model.decoder.final_layer_norm.weight", "norm_bias": "model.decoder.final_layer_norm.bias",
    "lm_head": "lm_head.weight",
}


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    if cfg.arch == "mla":
        from flexlamps.models.families.deepseek_weights import mla_hf_name

        return mla_hf_name(spec.name, spec.layer, spec.local_name)
    if cfg.arch == "llama":
        if spec.layer is None:
            return _LLAMA_HF_GLOBAL[spec.name]
        return f"model.layers.{spec.layer}.{_LLAMA_HF[spec.local_name]}"
    if spec.layer is None:
        return _OPT_HF_GLOBAL[spec.name]
    return f"model.decoder.layers.{spec.layer}.{_OPT_HF[spec.local_name]}"
