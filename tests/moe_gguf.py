"""GGUF files written with the `gguf` package from tiny HF checkpoints whose layers llama.cpp lays
out apart from the LLaMA-like ones (tests/decoder_gguf.py writes those, Mixtral / Qwen2-MoE /
Qwen3-MoE included), under its architecture, metadata and tensor names (as its
convert_hf_to_gguf.py lays them out): DeepSeek-V2/V3 as "deepseek2", gpt-oss with MXFP4 experts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.gguf_models import add_made_up_vocabulary


_MLA_TENSORS = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                "self_attn.q_a_proj.weight": "attn_q_a.weight",
                "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
                "self_attn.q_b_proj.weight": "attn_q_b.weight",
                "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
                "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
                "self_attn.o_proj.weight": "attn_output.weight",
                "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
                "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
                "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
                "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
                "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight"}


def _mla_layer(t: dict, i: int, hf: dict) -> dict[str, np.ndarray]:
    """One deepseek2 block as llama.cpp's converter writes it: kv_b_proj split per head into
    attn_k_b (nope rows, transposed) and attn_v_b; experts stacked."""
    p = f"model.layers.{i}."
    out = {gguf_name: t[p + name] for name, gguf_name in _MLA_TENSORS.items() if p + name in t}
    heads, nope, v = hf["num_attention_heads"], hf["qk_nope_head_dim"], hf["v_head_dim"]
    kv_b = t[p + "self_attn.kv_b_proj.weight"].reshape(heads, nope + v, -1)
    out["attn_k_b.weight"] = np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1))
    out["attn_v_b.weight"] = kv_b[:, nope:]
    if p + "mlp.experts.0.gate_proj.weight" in t:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out[f"ffn_{proj[:-5]}_exps.weight"] = np.stack(
                [t[p + f"mlp.experts.{e}.{proj}.weight"] for e in range(hf["n_routed_experts"])])
    return out


def write_deepseek2_gguf(folder: Path, path: Path, gating_func: int | None = None) -> Path:
    """A DeepSeek-V2/V3 checkpoint as llama.cpp's deepseek2 GGUF (no rope scaling); `gating_func`:
    the expert_gating_func to write (1 softmax, 2 sigmoid; None: none, llama.cpp's softmax default)."""
    import gguf
    from safetensors.numpy import load_file

    hf = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    a = "deepseek2"
    w = gguf.GGUFWriter(str(path), a)
    kv, rope = hf["kv_lora_rank"], hf["qk_rope_head_dim"]
    u32 = {"embedding_length": hf["hidden_size"], "block_count": hf["num_hidden_layers"],
           "feed_forward_length": hf["intermediate_size"], "attention.head_count": hf["num_attention_heads"],
           "attention.head_count_kv": 1, "vocab_size": hf["vocab_size"],
           "context_length": hf["max_position_embeddings"],
           "leading_dense_block_count": hf["first_k_dense_replace"], "attention.kv_lora_rank": kv,
           "attention.key_length": kv + rope, "attention.value_length": kv,
           "attention.key_length_mla": hf["qk_nope_head_dim"] + rope, "attention.value_length_mla": hf["v_head_dim"],
           "expert_feed_forward_length": hf["moe_intermediate_size"], "expert_count": hf["n_routed_experts"],
           "expert_used_count": hf["num_experts_per_tok"], "expert_shared_count": hf["n_shared_experts"],
           "rope.dimension_count": rope}
    if hf.get("q_lora_rank"):
        u32["attention.q_lora_rank"] = hf["q_lora_rank"]
    if (hf.get("n_group") or 1) > 1:
        u32.update({"expert_group_count": hf["n_group"], "expert_group_used_count": hf["topk_group"]})
    if gating_func is not None:
        u32["expert_gating_func"] = gating_func
    for key, value in u32.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.expert_weights_scale", hf["routed_scaling_factor"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", hf["rms_norm_eps"])
    w.add_float32(f"{a}.rope.freq_base", hf["rope_parameters"]["rope_theta"])
    add_made_up_vocabulary(w, hf["vocab_size"])
    tensors = {"token_embd.weight": t["model.embed_tokens.weight"], "output_norm.weight": t["model.norm.weight"]}
    if "lm_head.weight" in t:
        tensors["output.weight"] = t["lm_head.weight"]
    for i in range(hf["num_hidden_layers"]):
        tensors.update({f"blk.{i}.{k}": v for k, v in _mla_layer(t, i, hf).items()})
    for name, value in tensors.items():
        w.add_tensor(name, value.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss's MXFP4 (blocks (..., G, 16): elements 2i, 2i+1 per byte; scales (..., G)) as ggml's
    block_mxfp4 bytes (..., G * 17): the exponent, then elements 0-15 in the low nibbles, 16-31 high."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], packed], axis=-1).reshape(*blocks.shape[:-2], -1).astype(np.uint8)


def write_gpt_oss_gguf(folder: Path, path: Path) -> Path:
    """A gpt-oss checkpoint with MXFP4 experts as llama.cpp's gpt-oss GGUF: experts MXFP4 (gate and
    up split from the interleaved gate_up), their biases, router weight and bias, sinks."""
    import gguf
    from safetensors.numpy import load_file

    hf = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    a, rope = "gpt-oss", hf["rope_parameters"]
    w = gguf.GGUFWriter(str(path), a)
    for key, value in (("embedding_length", hf["hidden_size"]), ("block_count", hf["num_hidden_layers"]),
                       ("feed_forward_length", hf["intermediate_size"]), ("attention.head_count",
                                                                          hf["num_attention_heads"]),
                       ("attention.head_count_kv", hf["num_key_value_heads"]), ("attention.key_length", hf["head_dim"]),
                       ("attention.value_length", hf["head_dim"]), ("vocab_size", hf["vocab_size"]),
                       ("context_length", hf["max_position_embeddings"]), ("expert_count", hf["num_local_experts"]),
                       ("expert_used_count", hf["num_experts_per_tok"]), ("expert_feed_forward_length",
                                                                          hf["intermediate_size"]),
                       ("attention.sliding_window", hf["sliding_window"]),
                       ("rope.scaling.original_context_length", rope["original_max_position_embeddings"])):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", hf["rms_norm_eps"])
    w.add_float32(f"{a}.rope.freq_base", rope["rope_theta"])
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", rope["factor"])
    add_made_up_vocabulary(w, hf["vocab_size"])
    tensors = {"token_embd.weight": t["model.embed_tokens.weight"], "output_norm.weight": t["model.norm.weight"]}
    if "lm_head.weight" in t:
        tensors["output.weight"] = t["lm_head.weight"]
    mxfp4 = {}
    for i in range(hf["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for ours, theirs in (("attn_norm.weight", "input_layernorm.weight"), ("post_attention_norm.weight",
                                                                              "post_attention_layernorm.weight"),
                             ("attn_sinks.weight", "self_attn.sinks"), ("ffn_gate_inp.weight", "mlp.router.weight"),
                             ("ffn_gate_inp.bias", "mlp.router.bias"), ("ffn_down_exps.bias",
                                                                        "mlp.experts.down_proj_bias")):
            tensors[b + ours] = t[p + theirs]
        for x, name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
            tensors[f"{b}attn_{x}.weight"] = t[p + f"self_attn.{name}.weight"]
            tensors[f"{b}attn_{x}.bias"] = t[p + f"self_attn.{name}.bias"]
        gate_up_bias = t[p + "mlp.experts.gate_up_proj_bias"]
        tensors[b + "ffn_gate_exps.bias"], tensors[b + "ffn_up_exps.bias"] = gate_up_bias[:, 0::2], gate_up_bias[:,
                                                                                                                 1::2]
        blocks, scales = t[p + "mlp.experts.gate_up_proj_blocks"], t[p + "mlp.experts.gate_up_proj_scales"]
        mxfp4[b + "ffn_gate_exps.weight"] = _ggml_mxfp4(blocks[:, 0::2], scales[:, 0::2])
        mxfp4[b + "ffn_up_exps.weight"] = _ggml_mxfp4(blocks[:, 1::2], scales[:, 1::2])
        mxfp4[b + "ffn_down_exps.weight"] = _ggml_mxfp4(t[p + "mlp.experts.down_proj_blocks"],
                                                        t[p + "mlp.experts.down_proj_scales"])
    for name, value in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(value).astype(np.float32))
    for name, value in mxfp4.items():
        w.add_tensor(name, value, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
