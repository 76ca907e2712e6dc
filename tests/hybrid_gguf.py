"""GGUF files written with the `gguf` package from tiny hybrid checkpoints (tests/checkpoints.py),
laid out as llama.cpp's convert_hf_to_gguf.py lays out Qwen3-Next ("qwen3next") and Qwen3.5 text
("qwen35"): its metadata keys and tensor names, its changes to the values (norms but the DeltaNet's
stored as `w + 1`, `ssm_a = -exp(A_log)`, conv taps squeezed, Qwen3-Next's in_proj_qkvz split into
all q, k, v and all z, Qwen3.5's value heads tiled instead of grouped by key head), dense layers
of a Qwen3-Next checkpoint as llama.cpp would run them (`ffn_gate` / `ffn_up` / `ffn_down`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.decoder_gguf import _tokenizer_metadata

ARCH = {"qwen3_next": "qwen3next", "qwen3_5_text": "qwen35"}
_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
          "self_attn.o_proj.weight": "attn_output.weight", "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
          "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
          "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
          "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.A_log": "ssm_a",
          "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.norm.weight": "ssm_norm.weight",
          "linear_attn.out_proj.weight": "ssm_out.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
          "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}
_NAMES.update({f"self_attn.{x}_proj.weight": f"attn_{x}.weight" for x in "qkv"})
_NAMES.update({f"mlp.{x}_proj.weight": f"ffn_{x}.weight" for x in ("gate", "up", "down")})
_NAMES.update({f"mlp.shared_expert.{x}_proj.weight": f"ffn_{x}_shexp.weight" for x in ("gate", "up", "down")})


def tiled(w: np.ndarray, dim: int, key_heads: int, per_key: int, head_dim: int) -> np.ndarray:
    """The converter's `_reorder_v_heads`: value heads grouped by key head -> tiled."""
    shape = list(w.shape)
    w = w.reshape(*shape[:dim], key_heads, per_key, head_dim, *shape[dim + 1:])
    return np.swapaxes(w, dim, dim + 1).reshape(shape)


def _split_qkvz(w: np.ndarray, hf: dict) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3NextModel.modify_tensors: per key head [q, k, v, z] rows -> all q, k, v and all z."""
    hk, dk = hf["linear_num_key_heads"], hf["linear_key_head_dim"]
    per = hf["linear_num_value_heads"] // hk * hf["linear_value_head_dim"]
    q, k, v, z = np.split(w.reshape(hk, -1, w.shape[1]), np.cumsum([dk, dk, per])[:3], axis=1)
    flat = [x.reshape(-1, w.shape[1]) for x in (q, k, v, z)]
    return np.concatenate(flat[:3]), flat[3]


def _tile_qwen35(local: str, value: np.ndarray, hf: dict) -> np.ndarray:
    hk, hv, dv = hf["linear_num_key_heads"], hf["linear_num_value_heads"], hf["linear_value_head_dim"]
    if hk == hv or not local.startswith("linear_attn."):
        return value
    r, qk = hv // hk, 2 * hk * hf["linear_key_head_dim"]
    if local.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        return np.concatenate([value[:qk], tiled(value[qk:], 0, hk, r, dv)])
    if local.endswith("in_proj_z.weight"):
        return tiled(value, 0, hk, r, dv)
    if local.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_bias")):
        return tiled(value, 0, hk, r, 1)
    if local.endswith("out_proj.weight"):
        return tiled(value, 1, hk, r, dv)
    return value


def _layer(t: dict, i: int, hf: dict, a: str) -> dict[str, np.ndarray]:
    p, out = f"model.layers.{i}.", {}
    for name, value in t.items():
        if not name.startswith(p) or ".experts." in name:
            continue
        local = name[len(p):]
        if local == "linear_attn.in_proj_qkvz.weight":
            out["attn_qkv.weight"], out["attn_gate.weight"] = _split_qkvz(value, hf)
            continue
        if local.endswith("conv1d.weight"):
            value = value.squeeze(1)
        value = _tile_qwen35(local, value, hf) if a == "qwen35" else value
        if local.endswith("A_log"):  # in float32 by torch, as the converter computes it
            value = -torch.exp(torch.from_numpy(value)).numpy()
        elif local.endswith("norm.weight") and local != "linear_attn.norm.weight":
            value = value + np.float32(1)
        out[_NAMES[local]] = value
    if f"{p}mlp.experts.0.gate_proj.weight" in t:
        for proj in ("gate", "up", "down"):
            out[f"ffn_{proj}_exps.weight"] = np.stack([t[f"{p}mlp.experts.{e}.{proj}_proj.weight"]
                                                       for e in range(hf["num_experts"])])
    return out


def _metadata(w, a: str, hf: dict, mtp_layers: int) -> None:
    head_dim = hf["head_dim"]
    blocks = hf["num_hidden_layers"] + mtp_layers
    u32 = {"block_count": blocks, "context_length": hf["max_position_embeddings"],
           "embedding_length": hf["hidden_size"], "feed_forward_length": hf["intermediate_size"],
           "attention.head_count": hf["num_attention_heads"], "attention.head_count_kv": hf["num_key_value_heads"],
           "attention.key_length": head_dim, "attention.value_length": head_dim, "vocab_size": hf["vocab_size"],
           "ssm.conv_kernel": hf["linear_conv_kernel_dim"], "ssm.state_size": hf["linear_key_head_dim"],
           "ssm.group_count": hf["linear_num_key_heads"], "ssm.time_step_rank": hf["linear_num_value_heads"],
           "ssm.inner_size": hf["linear_value_head_dim"] * hf["linear_num_value_heads"],
           "full_attention_interval": hf.get("full_attention_interval", 4),
           "rope.dimension_count": int(head_dim * hf["rope_parameters"].get("partial_rotary_factor", 0.25))}
    if hf.get("num_experts"):
        u32.update({"expert_count": hf["num_experts"], "expert_used_count": hf["num_experts_per_tok"],
                    "expert_feed_forward_length": hf["moe_intermediate_size"],
                    "expert_shared_feed_forward_length": hf["shared_expert_intermediate_size"]})
    if mtp_layers:
        u32["nextn_predict_layers"] = mtp_layers
    for key, value in u32.items():
        w.add_uint32(f"{a}.{key}", value)
    recurrent = [t == "linear_attention" for t in hf["layer_types"]] + [False] * mtp_layers
    w.add_array(f"{a}.attention.recurrent_layers", recurrent)
    w.add_float32(f"{a}.rope.freq_base", hf["rope_parameters"]["rope_theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", hf["rms_norm_eps"])
    if a == "qwen35":
        w.add_array(f"{a}.rope.dimension_sections", [11, 11, 10, 0])
    w.add_uint32("tokenizer.ggml.bos_token_id", hf["bos_token_id"])
    w.add_uint32("tokenizer.ggml.eos_token_id", hf["eos_token_id"])


def write_hybrid_gguf(folder: Path, path: Path, extra: dict[str, np.ndarray] | None = None,
                      mtp_layers: int = 0, quantize: str | None = None) -> Path:
    """The float32 hybrid checkpoint in `folder` as llama.cpp's converter writes it, with `mtp_layers`
    multi-token-prediction blocks counted (their tensors, if any, in `extra`); `quantize`: a gguf
    quant type name (e.g. "Q8_0") for the matrices whose rows it can take."""
    import gguf
    from safetensors.numpy import load_file

    hf = json.loads((folder / "config.json").read_text())
    a = ARCH[hf["model_type"]]
    t = load_file(str(folder / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), a)
    _metadata(w, a, hf, mtp_layers)
    _tokenizer_metadata(w, folder, hf["vocab_size"])
    tensors = {"token_embd.weight": t["model.embed_tokens.weight"],
               "output_norm.weight": t["model.norm.weight"] + np.float32(1)}
    if "lm_head.weight" in t:
        tensors["output.weight"] = t["lm_head.weight"]
    for i in range(hf["num_hidden_layers"]):
        tensors.update({f"blk.{i}.{k}": v for k, v in _layer(t, i, hf, a).items()})
    for name, value in {**tensors, **(extra or {})}.items():
        value = np.ascontiguousarray(value, dtype=np.float32)
        if quantize and value.ndim >= 2 and value.shape[-1] % 32 == 0 and "conv1d" not in name:
            qtype = gguf.GGMLQuantizationType[quantize]
            w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
