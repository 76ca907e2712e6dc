"""GGUF files written with the `gguf` package from tiny HF checkpoints of the LLaMA-like families,
laid out as llama.cpp's convert_hf_to_gguf.py lays them out: its architecture names, metadata keys
and tensor names, and its changes to the values (q/k rows and biases interleaved for the "llama",
"smollm3" and "granite" architectures, Gemma's norms stored as `w + 1`, Gemma-2's head dropped,
Phi-3's rope factors as tensors, GLM-4.5's block count including its multi-token-prediction layer).

`write_decoder_gguf(folder, path)` takes qwen2, llama, mistral, qwen3, smollm3, granite, gemma2,
gemma3_text, phi3 and the MoE mixtral (as "llama", experts stacked), qwen2_moe, qwen3_moe, olmoe and
glm4_moe checkpoints; `write_hf_as_gguf` any family a GGUF writer here knows (MLA and gpt-oss ones
from tests/moe_gguf.py). Values a GGUF cannot carry (a Gemma `query_pre_attn_scalar`
other than llama.cpp's, SmolLM3's no-rope interval other than 4, a window on llama/qwen2/qwen3) are
refused, so a written file always means the checkpoint's model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "smollm3": "smollm3",
        "granite": "granite", "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3", "olmoe": "olmoe",
        "glm4_moe": "glm4moe", "mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
_PERMUTED = ("llama", "smollm3", "granite")  # llama.cpp's LlamaModel and its subclasses
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.o_proj.bias": "attn_output.bias", "self_attn.qkv_proj.weight": "attn_qkv.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
          "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight":
              "post_ffw_norm.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
          "mlp.gate.e_score_correction_bias": "exp_probs_b.bias"}
_LAYER.update({f"self_attn.{x}_proj.{k}": f"attn_{x}.{k}" for x in "qkv" for k in ("weight", "bias")})
_LAYER.update({f"mlp.{x}_proj.{k}": f"ffn_{x}.{k}" for x in ("gate", "up", "down") for k in ("weight", "bias")})
_LAYER.update({f"mlp.{shared}.{x}_proj.weight": f"ffn_{x}_shexp.weight" for x in ("gate", "up", "down")
               for shared in ("shared_experts", "shared_expert")})  # DeepSeek-style / Qwen2-MoE's
_LAYER.update({"block_sparse_moe.gate.weight": "ffn_gate_inp.weight",  # Mixtral's router
               "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"})  # Qwen2-MoE's, 1-D in a GGUF
# a layer's experts: HF's per-expert prefix and projection names -> llama.cpp's stacked tensors
_EXPERTS = {"mlp.experts": {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"},
            "block_sparse_moe.experts": {"w1": "gate", "w3": "up", "w2": "down"}}  # Mixtral's
# where HF's post_attention_layernorm is not llama.cpp's ffn_norm
_POST_ATTENTION = {"gemma2": "post_attention_norm.weight", "gemma3": "post_attention_norm.weight",
                   "glm4moe": "post_attention_norm.weight"}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order of LLaMA's q/k weights and biases (convert_hf_to_gguf's LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _refuse_unwritable(hf: dict, arch: str) -> None:
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if arch.startswith("gemma") and hf.get("query_pre_attn_scalar", head_dim) != head_dim:
        raise ValueError("llama.cpp scales Gemma's attention by head_dim ** -0.5 (no query_pre_attn_scalar key)")
    if arch == "smollm3" and (hf.get("no_rope_layer_interval", 4) != 4 or hf.get("use_sliding_window")):
        raise ValueError("llama.cpp's SmolLM3 skips rope on every 4th layer, without a window")
    if arch in ("llama", "qwen2", "qwen3") and hf.get("sliding_window") and hf.get("use_sliding_window", True):
        raise ValueError(f"llama.cpp's converter writes no sliding window for {arch}")
    if arch == "gemma2" and not hf.get("tie_word_embeddings", True):
        raise ValueError("llama.cpp's Gemma-2 ties its head to the embedding")


def _rope_metadata(w, a: str, hf: dict) -> None:
    params = hf.get("rope_parameters") or {}
    params = params.get("full_attention", params)
    w.add_float32(f"{a}.rope.freq_base", params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", "default")
    if kind in ("linear", "yarn"):
        w.add_string(f"{a}.rope.scaling.type", kind)
        w.add_float32(f"{a}.rope.scaling.factor", params["factor"])
    if kind == "yarn":
        w.add_uint32(f"{a}.rope.scaling.original_context_length", params["original_max_position_embeddings"])
    if a == "gemma3" and "sliding_attention" in (hf.get("rope_parameters") or {}):
        w.add_float32(f"{a}.rope.freq_base_swa", hf["rope_parameters"]["sliding_attention"]["rope_theta"])


def _metadata(w, a: str, hf: dict) -> None:
    # GLM-4.5's multi-token-prediction layers count as blocks (the tiny checkpoints have none of their tensors)
    blocks = hf["num_hidden_layers"] + (hf.get("num_nextn_predict_layers", 0) if a == "glm4moe" else 0)
    u32 = {"embedding_length": hf["hidden_size"], "block_count": blocks,
           "feed_forward_length": hf["intermediate_size"], "attention.head_count": hf["num_attention_heads"],
           "attention.head_count_kv": hf["num_key_value_heads"], "context_length": hf["max_position_embeddings"],
           "vocab_size": hf["vocab_size"]}
    if hf.get("head_dim") and a not in ("granite", "phi3"):  # llama.cpp's converters do not write it for these
        u32.update({"attention.key_length": hf["head_dim"], "attention.value_length": hf["head_dim"]})
    if a in ("gemma2", "gemma3") and hf.get("sliding_window"):
        u32["attention.sliding_window"] = hf["sliding_window"]
        w.add_array(f"{a}.attention.sliding_window_pattern", [t == "sliding_attention" for t in hf["layer_types"]])
    for key, value in u32.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", hf["rms_norm_eps"])
    _rope_metadata(w, a, hf)
    floats = {"gemma2": ("attn_logit_softcapping", "final_logit_softcapping"), "gemma3": ("final_logit_softcapping",)}
    for key in floats.get(a, ()):
        if hf.get(key) is not None:
            w.add_float32(f"{a}.{key}", hf[key])
    if a == "granite":
        for ours, theirs in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                             ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):
            w.add_float32(f"{a}.{ours}", hf[theirs])
    w.add_uint32("tokenizer.ggml.bos_token_id", hf["bos_token_id"])
    w.add_uint32("tokenizer.ggml.eos_token_id", hf["eos_token_id"])


def _tokenizer_metadata(w, folder: Path, vocab_size: int) -> None:
    """The folder's byte-level BPE tokenizer as GPT-2's GGUF vocabulary (what the converter writes for
    it: tokens by id, padded to vocab_size, specials as control tokens, merges), BOS added as its
    tokenizer_config says; a made-up token list when the folder has no tokenizer.json."""
    path = folder / "tokenizer.json"
    if not path.exists():
        w.add_token_list([f"t{i}" for i in range(vocab_size)])
        return
    tk = json.loads(path.read_text())
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [1] * vocab_size  # NORMAL
    for token, i in tk["model"]["vocab"].items():
        tokens[i] = token
    for added in tk["added_tokens"]:
        tokens[added["id"]], types[added["id"]] = added["content"], 3 if added["special"] else 4  # CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tk["model"]["merges"]])
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    w.add_add_bos_token(bool(config.get("add_bos_token", False)))
    if config.get("chat_template"):
        w.add_chat_template(config["chat_template"])


def _phi3_rope(w, hf: dict) -> dict[str, np.ndarray]:
    """Phi-3's rotated width, original context, sliding window, and LongRoPE's factors as tensors."""
    params, a = hf.get("rope_parameters") or hf.get("rope_scaling") or {}, "phi3"
    head_dim = hf["hidden_size"] // hf["num_attention_heads"]
    w.add_uint32(f"{a}.rope.dimension_count", int(params.get("partial_rotary_factor", 1.0) * head_dim))
    w.add_uint32(f"{a}.rope.scaling.original_context_length", hf.get("original_max_position_embeddings")
                 or params["original_max_position_embeddings"])
    w.add_uint32(f"{a}.attention.sliding_window", hf.get("sliding_window") or 0)
    if params.get("rope_type") != "longrope":
        return {}
    return {"rope_factors_long.weight": np.array(params["long_factor"], np.float32),
            "rope_factors_short.weight": np.array(params["short_factor"], np.float32)}


def _num_experts(hf: dict) -> int:
    return hf.get("num_experts") or hf.get("n_routed_experts") or hf.get("num_local_experts") or 0


def _moe_metadata(w, a: str, hf: dict) -> None:
    u32 = {"expert_count": _num_experts(hf), "expert_used_count": hf["num_experts_per_tok"],
           "expert_feed_forward_length": hf.get("moe_intermediate_size") or hf["intermediate_size"]}
    if hf.get("shared_expert_intermediate_size"):
        u32["expert_shared_feed_forward_length"] = hf["shared_expert_intermediate_size"]
    if a == "qwen3moe" and hf.get("norm_topk_prob") is not None:
        w.add_bool(f"{a}.expert_weights_norm", hf["norm_topk_prob"])
    if a == "glm4moe":
        head_dim = hf["head_dim"]
        u32.update({"nextn_predict_layers": hf.get("num_nextn_predict_layers", 0),
                    "expert_shared_count": hf["n_shared_experts"],
                    "leading_dense_block_count": hf["first_k_dense_replace"], "expert_gating_func": 2,
                    "expert_group_count": hf["n_group"], "expert_group_used_count": hf["topk_group"],
                    "rope.dimension_count": int(head_dim * hf["rope_parameters"]["partial_rotary_factor"])})
        w.add_float32(f"{a}.expert_weights_scale", hf["routed_scaling_factor"])
        w.add_bool(f"{a}.expert_weights_norm", hf["norm_topk_prob"])
    for key, value in u32.items():
        w.add_uint32(f"{a}.{key}", value)


def _layer(t: dict, i: int, hf: dict, a: str) -> dict[str, np.ndarray]:
    p, out = f"model.layers.{i}.", {}
    heads = {"q": hf["num_attention_heads"], "k": hf["num_key_value_heads"]}
    for name, value in t.items():
        if not name.startswith(p) or ".experts." in name:
            continue
        local = name[len(p):]
        gguf_name = _POST_ATTENTION.get(a) if local == "post_attention_layernorm.weight" else None
        gguf_name = gguf_name or _LAYER[local]
        if a in _PERMUTED and local.startswith(("self_attn.q_proj", "self_attn.k_proj")):
            value = permute(value, heads[local[10]])
        out[gguf_name] = value.reshape(-1) if local == "mlp.shared_expert_gate.weight" else value
    for prefix, projs in _EXPERTS.items():
        if f"{p}{prefix}.0.{next(iter(projs))}.weight" in t:
            for theirs, ours in projs.items():
                out[f"ffn_{ours}_exps.weight"] = np.stack([t[f"{p}{prefix}.{e}.{theirs}.weight"]
                                                           for e in range(_num_experts(hf))])
    return out


def write_decoder_gguf(folder: Path, path: Path, extra: dict[str, np.ndarray] | None = None,
                       quantize_experts: str | None = None) -> Path:
    """The float32 checkpoint in `folder` as llama.cpp's converter writes it (see the module doc),
    with the tensors `extra` added; `quantize_experts`: a gguf quant type name (e.g. "Q8_0") for every
    stacked expert tensor (ValueError where one's rows are not whole blocks of it)."""
    import gguf
    from safetensors.numpy import load_file

    hf = json.loads((folder / "config.json").read_text())
    a = ARCH[hf["model_type"]]
    _refuse_unwritable(hf, a)
    t = load_file(str(folder / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), a)
    _metadata(w, a, hf)
    _tokenizer_metadata(w, folder, hf["vocab_size"])
    tensors = _phi3_rope(w, hf) if a == "phi3" else {}
    if _num_experts(hf):
        _moe_metadata(w, a, hf)
    tensors.update({"token_embd.weight": t["model.embed_tokens.weight"], "output_norm.weight": t["model.norm.weight"]})
    if "lm_head.weight" in t and a != "gemma2":
        tensors["output.weight"] = t["lm_head.weight"]
    for i in range(hf["num_hidden_layers"]):
        tensors.update({f"blk.{i}.{k}": v for k, v in _layer(t, i, hf, a).items()})
    for name, value in {**tensors, **(extra or {})}.items():
        value = value.astype(np.float32)
        if quantize_experts and name.endswith("_exps.weight"):
            qtype = gguf.GGMLQuantizationType[quantize_experts]
            w.add_tensor(name, _quantized(value, qtype, name), raw_dtype=qtype)
            continue
        w.add_tensor(name, value + np.float32(1) if a.startswith("gemma") and name.endswith("norm.weight") else value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _quantized(value: np.ndarray, qtype, name: str) -> np.ndarray:
    """`value` in the ggml type `qtype`; a ValueError naming the tensor where its rows are not whole
    blocks (a file asked for quantized experts never holds some of them in f32)."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if value.shape[-1] % block:
        raise ValueError(f"{name}: rows of {value.shape[-1]} are not whole {qtype.name} blocks of {block}; "
                         f"give the checkpoint widths that are")
    return gguf.quants.quantize(value, qtype)


def write_hf_as_gguf(folder: Path, path: Path) -> Path:
    """Any tiny checkpoint a writer here knows, as llama.cpp's GGUF (MLA and gpt-oss ones:
    tests/moe_gguf.py, hybrid ones: tests/hybrid_gguf.py)."""
    from tests.moe_gguf import write_deepseek2_gguf, write_gpt_oss_gguf

    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    if model_type in ARCH:
        return write_decoder_gguf(folder, path)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return write_deepseek2_gguf(folder, path, gating_func=2 if model_type == "deepseek_v3" else None)
    if model_type == "gpt_oss":
        return write_gpt_oss_gguf(folder, path)
    if model_type in ("qwen3_next", "qwen3_5_text"):
        from tests.hybrid_gguf import write_hybrid_gguf

        return write_hybrid_gguf(folder, path)
    raise ValueError(f"no GGUF writer for model_type {model_type!r}")
