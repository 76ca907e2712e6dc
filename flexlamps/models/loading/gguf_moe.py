"""Mixture-of-experts GGUF files under llama.cpp's names (torch-free): the config fields of
Mixtral (llama.cpp's "llama" with `expert_count`), Qwen2-MoE ("qwen2moe"), Qwen3-MoE ("qwen3moe"),
gpt-oss ("gpt-oss": MXFP4 experts kept 4-bit) and DeepSeek-V2/V3
("deepseek2": MLA, its kv_b_proj split into `attn_k_b` (transposed) and `attn_v_b` by llama.cpp's
converter), and where each of our weights lies. llama.cpp stacks a layer's experts in one 3-D tensor per projection
(`ffn_gate_exps` (E, F, H) in numpy order, ...); each expert is one slab of it, read on its own,
so experts stay separate weights (and keep their quantized blocks)."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import UnsupportedModelError

# our MoE local names -> llama.cpp's tensor (after `blk.{i}.`); expert projections are slabs
_EXPERT_TENSORS = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                   "down_proj": "ffn_down_exps.weight"}
_EXPERT_BIASES = {"gate_bias": "ffn_gate_exps.bias", "up_bias": "ffn_up_exps.bias", "down_bias": "ffn_down_exps.bias"}
_MOE_TENSORS = {"router": "ffn_gate_inp.weight", "router_bias": "exp_probs_b.bias",
                "shared_gate_proj": "ffn_gate_shexp.weight", "shared_up_proj": "ffn_up_shexp.weight",
                "shared_down_proj": "ffn_down_shexp.weight", "shared_expert_gate": "ffn_gate_inp_shexp.weight"}


def moe_gguf_tensor(local: str, model_type: str = "") -> tuple[str, int | None] | None:
    """(llama.cpp tensor name, expert slab or None) of a MoE weight; None for other weights."""
    if local == "router_bias" and model_type == "gpt_oss":
        return "ffn_gate_inp.bias", None
    if local.startswith("experts."):
        _, e, proj = local.split(".")
        return {**_EXPERT_TENSORS, **_EXPERT_BIASES}[proj], int(e)
    name = _MOE_TENSORS.get(local)
    return None if name is None else (name, None)


def moe_hf_fields(arch: str, f: dict[str, Any], hf: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    """The HF config fields (model_type included) a MoE GGUF adds to `hf`, its LLaMA-like
    fields; {} for a dense file."""
    experts = f.get(f"{arch}.expert_count") or 0
    if not experts:
        return {}
    used = f[f"{arch}.expert_used_count"]
    if arch == "llama":  # Mixtral: experts as wide as the dense FFN would be, renormalized top-k
        return {"model_type": "mixtral", "num_local_experts": experts, "num_experts_per_tok": used}
    if arch == "olmoe":  # experts as wide as feed_forward_length; q/k norms over the whole projection
        return {"model_type": "olmoe", "num_experts": experts, "num_experts_per_tok": used,
                "norm_topk_prob": bool(f.get(f"{arch}.expert_weights_norm", False))}
    if arch == "glm4moe":
        return _glm4moe_fields(f, hf, types, experts, used)
    if arch == "qwen3moe":  # per-head q/k norms (attn_q_norm / attn_k_norm); renormalized unless the file says
        return {"model_type": "qwen3_moe", "num_experts": experts, "num_experts_per_tok": used,
                "moe_intermediate_size": f[f"{arch}.expert_feed_forward_length"],
                "norm_topk_prob": bool(f.get(f"{arch}.expert_weights_norm", True)),
                "attention_bias": hf.get("attention_bias", False)}
    # qwen2moe: top-k never renormalized in llama.cpp's Qwen2-MoE graph; a gated shared expert
    return {"model_type": "qwen2_moe", "num_experts": experts, "num_experts_per_tok": used,
            "moe_intermediate_size": f[f"{arch}.expert_feed_forward_length"],
            "shared_expert_intermediate_size": f.get(f"{arch}.expert_shared_feed_forward_length", 0),
            "norm_topk_prob": False, "qkv_bias": hf.get("attention_bias", True),
            "intermediate_size": f.get(f"{arch}.feed_forward_length", f[f"{arch}.expert_feed_forward_length"])}


def _glm4moe_fields(f: dict[str, Any], hf: dict[str, Any], types: dict[str, str], experts: int,
                    used: int) -> dict[str, Any]:
    """GLM-4.5: llama.cpp's block_count counts the multi-token-prediction layers (`nextn_predict_layers`,
    not run); a sigmoid router with groups; the rotated width as `rope.dimension_count`."""
    a = "glm4moe"
    if f.get(f"{a}.expert_gating_func", 2) != 2:
        raise UnsupportedModelError(f"GGUF {a}.expert_gating_func {f[f'{a}.expert_gating_func']} is not supported "
                                    "(GLM-4.5's router is sigmoid: 2)")
    head_dim = hf["head_dim"] or hf["hidden_size"] // hf["num_attention_heads"]
    nextn = f.get(f"{a}.nextn_predict_layers", 0)
    return {"model_type": "glm4_moe", "num_hidden_layers": hf["num_hidden_layers"] - nextn,
            "num_nextn_predict_layers": nextn, "n_routed_experts": experts, "num_experts_per_tok": used,
            "moe_intermediate_size": f[f"{a}.expert_feed_forward_length"],
            "n_shared_experts": f.get(f"{a}.expert_shared_count", 0),
            "first_k_dense_replace": f.get(f"{a}.leading_dense_block_count", 0),
            "routed_scaling_factor": f.get(f"{a}.expert_weights_scale", 1.0),
            "norm_topk_prob": bool(f.get(f"{a}.expert_weights_norm", False)),
            "n_group": f.get(f"{a}.expert_group_count") or 1, "topk_group": f.get(f"{a}.expert_group_used_count") or 1,
            "use_qk_norm": "blk.0.attn_q_norm.weight" in types,
            "rope_parameters": {**hf["rope_parameters"],
                                "partial_rotary_factor": f.get(f"{a}.rope.dimension_count", head_dim) / head_dim}}


# DeepSeek's MLA and dense-FFN local names -> llama.cpp's deepseek2 tensors (kv_b_proj: `MLA_KV_B`)
MLA_GGUF_LAYER = {
    "attn_norm": "attn_norm.weight", "q_proj": "attn_q.weight", "q_a_proj": "attn_q_a.weight",
    "q_a_norm": "attn_q_a_norm.weight", "q_b_proj": "attn_q_b.weight", "kv_a_proj": "attn_kv_a_mqa.weight",
    "kv_a_norm": "attn_kv_a_norm.weight", "kv_b_proj": "attn_kv_b.weight", "o_proj": "attn_output.weight",
    "mlp_norm": "ffn_norm.weight", "gate_proj": "ffn_gate.weight", "up_proj": "ffn_up.weight",
    "down_proj": "ffn_down.weight",
}
MLA_KV_B = ("attn_k_b.weight", "attn_v_b.weight")  # (H, kv_lora_rank, nope) and (H, v, kv_lora_rank)


def deepseek2_hf_config(f: dict[str, Any], tensors: set[str]) -> dict[str, Any]:
    """A deepseek2 GGUF's HF config: deepseek_v3 when its router is sigmoid (gating func 2, or no
    gating func beside V3's correction bias `exp_probs_b`: llama.cpp's converter writes none for a
    V3 config without `scoring_func`), else deepseek_v2 (softmax; groups: group-limited greedy)."""
    a = "deepseek2"
    rope_dim = f[f"{a}.rope.dimension_count"]
    if f.get(f"{a}.rope.scaling.type") not in (None, "none"):
        raise UnsupportedModelError(f"deepseek2 GGUF rope scaling {f[f'{a}.rope.scaling.type']!r} is not supported")
    gating = f.get(f"{a}.expert_gating_func")
    sigmoid = gating == 2 or (gating is None and any(t.endswith(".exp_probs_b.bias") for t in tensors))
    groups = f.get(f"{a}.expert_group_count") or 1
    cfg = {
        "model_type": "deepseek_v3" if sigmoid else "deepseek_v2",
        "vocab_size": f.get(f"{a}.vocab_size", len(f["tokenizer.ggml.tokens"])),
        "hidden_size": f[f"{a}.embedding_length"], "num_hidden_layers": f[f"{a}.block_count"],
        "num_attention_heads": f[f"{a}.attention.head_count"], "intermediate_size": f[f"{a}.feed_forward_length"],
        "max_position_embeddings": f.get(f"{a}.context_length", 4096),
        "rms_norm_eps": f.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": f.get(f"{a}.rope.freq_base", 10000.0), "tie_word_embeddings": "output.weight" not in tensors,
        "q_lora_rank": f.get(f"{a}.attention.q_lora_rank"), "kv_lora_rank": f[f"{a}.attention.kv_lora_rank"],
        "qk_rope_head_dim": rope_dim, "qk_nope_head_dim": f[f"{a}.attention.key_length_mla"] - rope_dim,
        "v_head_dim": f[f"{a}.attention.value_length_mla"],
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"), "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }
    if f.get(f"{a}.expert_count"):
        cfg.update({
            "n_routed_experts": f[f"{a}.expert_count"], "num_experts_per_tok": f[f"{a}.expert_used_count"],
            "n_shared_experts": f.get(f"{a}.expert_shared_count", 0),
            "moe_intermediate_size": f[f"{a}.expert_feed_forward_length"],
            "first_k_dense_replace": f.get(f"{a}.leading_dense_block_count", 0),
            "routed_scaling_factor": f.get(f"{a}.expert_weights_scale", 1.0),
            "norm_topk_prob": bool(f.get(f"{a}.expert_weights_norm", False)),
            "n_group": groups, "topk_group": f.get(f"{a}.expert_group_used_count") or 1})
        if not sigmoid:
            cfg["topk_method"] = "group_limited_greedy" if groups > 1 else "greedy"
    else:
        cfg["first_k_dense_replace"] = cfg["num_hidden_layers"]
    return cfg


def gpt_oss_hf_config(f: dict[str, Any], tensor_types: dict[str, str]) -> dict[str, Any]:
    """A gpt-oss GGUF's HF config: llama.cpp slides the even layers (its swa pattern 2), keeps the
    YaRN parameters gpt-oss ships (beta 32 / 1, no truncation) and the router's logit bias
    (`ffn_gate_inp.bias`, read as `exp_probs_b`'s place: our `router_bias`); MXFP4 experts mark
    the config `quant_method: mxfp4`, so every tier keeps them 4-bit."""
    a = "gpt-oss"
    layers = f[f"{a}.block_count"]
    cfg = {
        "model_type": "gpt_oss", "vocab_size": f.get(f"{a}.vocab_size", len(f["tokenizer.ggml.tokens"])),
        "hidden_size": f[f"{a}.embedding_length"], "num_hidden_layers": layers,
        "num_attention_heads": f[f"{a}.attention.head_count"],
        "num_key_value_heads": f[f"{a}.attention.head_count_kv"], "head_dim": f[f"{a}.attention.key_length"],
        "intermediate_size": f[f"{a}.expert_feed_forward_length"],
        "max_position_embeddings": f.get(f"{a}.context_length", 131072),
        "rms_norm_eps": f.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        "num_local_experts": f[f"{a}.expert_count"], "num_experts_per_tok": f[f"{a}.expert_used_count"],
        "sliding_window": f[f"{a}.attention.sliding_window"],
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "attention_bias": "blk.0.attn_q.bias" in tensor_types,
        "tie_word_embeddings": "output.weight" not in tensor_types,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"), "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
        "rope_parameters": {"rope_type": "yarn", "rope_theta": f.get(f"{a}.rope.freq_base", 150000.0),
                            "factor": f.get(f"{a}.rope.scaling.factor", 32.0), "beta_fast": 32.0, "beta_slow": 1.0,
                            "truncate": False, "original_max_position_embeddings":
                                f.get(f"{a}.rope.scaling.original_context_length", 4096)},
    }
    if tensor_types.get("blk.0.ffn_gate_exps.weight") == "MXFP4":
        cfg["quantization_config"] = {"quant_method": "mxfp4"}
    return cfg
