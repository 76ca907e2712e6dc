"""GGUF files of the hybrid gated-DeltaNet models under llama.cpp's names: Qwen3-Next ("qwen3next")
and Qwen3.5 text ("qwen35"): the config from the metadata and the weights with the converter's
changes undone (convert_hf_to_gguf's Qwen3NextModel / _LinearAttentionVReorderBase):

- the `(1 + w)` RMSNorms (not the DeltaNet's gated norm) are stored as `w + 1`: read back as
  `value - 1` in fp32, which the norm's `1 + w` turns back into the file's value exactly;
- `A_log` is stored as `ssm_a = -exp(A_log)`: read back as the float32 nearest log(-ssm_a) for which
  the forward's `-exp(A_log)` gives the file's value bit for bit (`decay_log`);
- `dt_bias` is `ssm_dt.bias`; the conv taps lose their middle dim;
- Qwen3-Next's `in_proj_qkvz` (per key head: q, k, its value heads' v, their z) is split into
  `attn_qkv` (all q, all k, all v) and `attn_gate` (all z); `in_proj_ba` is `ssm_ba` as it was;
- Qwen3.5's value heads are tiled (head i of key group g at i * key_heads + g) instead of grouped by
  key head wherever they index rows, channels or columns (`_TILED`).

llama.cpp counts the multi-token-prediction layers in block_count (`nextn_predict_layers`, not run),
normalizes Qwen3-Next's top-k weights always, and runs a layer without `ffn_gate_inp` dense. Torch
only where a weight is rebuilt.
"""

from __future__ import annotations

from typing import Any, Callable

from flexlamps.models.config import UnsupportedModelError

# llama.cpp's architecture -> our model_type
HYBRID_ARCHITECTURES = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text"}
REFUSED_HYBRID = {"qwen35moe": "Qwen3.5-MoE (transformers qwen3_5_moe) is not a model flexlamps runs yet"}

# our local name -> llama.cpp's tensor (after `blk.{i}.`)
HYBRID_LAYER = {
    "attn_norm": "attn_norm.weight", "mlp_norm": "post_attention_norm.weight", "q_proj": "attn_q.weight",
    "k_proj": "attn_k.weight", "v_proj": "attn_v.weight", "o_proj": "attn_output.weight",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight", "in_proj_qkv": "attn_qkv.weight",
    "in_proj_z": "attn_gate.weight", "in_proj_ba": "ssm_ba.weight", "in_proj_b": "ssm_beta.weight",
    "in_proj_a": "ssm_alpha.weight", "conv1d": "ssm_conv1d.weight", "A_log": "ssm_a", "dt_bias": "ssm_dt.bias",
    "linear_norm": "ssm_norm.weight", "out_proj": "ssm_out.weight", "gate_proj": "ffn_gate.weight",
    "up_proj": "ffn_up.weight", "down_proj": "ffn_down.weight",
}
QKVZ_PARTS = ("attn_qkv.weight", "attn_gate.weight")  # Qwen3-Next's in_proj_qkvz, split
PLUS_ONE = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "norm")  # stored as w + 1
# Qwen3.5 weights whose value heads the converter tiles: (dim, rows per head: None = value_head_dim)
_TILED = {"in_proj_qkv": (0, None), "in_proj_z": (0, None), "in_proj_b": (0, 1), "in_proj_a": (0, 1),
          "A_log": (0, 1), "dt_bias": (0, 1), "conv1d": (0, None), "out_proj": (1, None)}


def hybrid_layer_names(spec_local: str) -> tuple[str, ...]:
    """The llama.cpp tensors (after `blk.{i}.`) a hybrid layer weight is read from."""
    return QKVZ_PARTS if spec_local == "in_proj_qkvz" else (HYBRID_LAYER[spec_local],)


def hybrid_hf_config(f: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    """The HF config.json fields of a qwen3next / qwen35 GGUF (metadata as written: `as_written`)."""
    a = f["general.architecture"]
    if a in REFUSED_HYBRID:
        raise UnsupportedModelError(f"GGUF architecture {a!r}: {REFUSED_HYBRID[a]}")
    if f.get(f"{a}.rope.scaling.type", "none") != "none":
        raise UnsupportedModelError(f"GGUF {a}.rope.scaling.type {f[f'{a}.rope.scaling.type']!r} is not supported "
                                    "for the hybrid models (none is)")
    layers = f[f"{a}.block_count"] - (f.get(f"{a}.nextn_predict_layers") or 0)
    heads, value_heads = f[f"{a}.attention.head_count"], f[f"{a}.ssm.time_step_rank"]
    head_dim = f.get(f"{a}.attention.key_length") or f[f"{a}.embedding_length"] // heads
    cfg = {
        "model_type": HYBRID_ARCHITECTURES[a], "vocab_size": f.get(f"{a}.vocab_size", len(f["tokenizer.ggml.tokens"])),
        "hidden_size": f[f"{a}.embedding_length"], "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": f.get(f"{a}.attention.head_count_kv", heads), "head_dim": head_dim,
        "intermediate_size": f[f"{a}.feed_forward_length"],
        "max_position_embeddings": f.get(f"{a}.context_length", 32768),
        "rms_norm_eps": f.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "tie_word_embeddings": "output.weight" not in types, "layer_types": _layer_types(a, f, layers),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(f.get(f"{a}.rope.freq_base", 10000.0)),
                            "partial_rotary_factor": f[f"{a}.rope.dimension_count"] / head_dim},
        "linear_conv_kernel_dim": f[f"{a}.ssm.conv_kernel"], "linear_key_head_dim": f[f"{a}.ssm.state_size"],
        "linear_num_key_heads": f[f"{a}.ssm.group_count"], "linear_num_value_heads": value_heads,
        "linear_value_head_dim": f[f"{a}.ssm.inner_size"] // value_heads,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"), "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }
    if a == "qwen3next" and f.get(f"{a}.expert_count"):
        cfg.update(num_experts=f[f"{a}.expert_count"], num_experts_per_tok=f[f"{a}.expert_used_count"],
                   moe_intermediate_size=f[f"{a}.expert_feed_forward_length"], norm_topk_prob=True,
                   shared_expert_intermediate_size=f.get(f"{a}.expert_shared_feed_forward_length", 0),
                   decoder_sparse_step=1,
                   mlp_only_layers=[i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in types])
    return cfg


def _layer_types(a: str, f: dict[str, Any], layers: int) -> list[str]:
    """`attention.recurrent_layers` (one flag a block, the MTP ones included) when written, else
    every `full_attention_interval`-th layer full attention, as llama.cpp reads them."""
    flags = f.get(f"{a}.attention.recurrent_layers")
    if flags is None:
        every = f.get(f"{a}.full_attention_interval", 4)
        flags = [(i + 1) % every != 0 for i in range(layers)]
    return ["linear_attention" if flag else "full_attention" for flag in flags[:layers]]


def changed_by_converter(cfg, spec) -> bool:
    """Whether the converter changed `spec`'s values or layout (so it is rebuilt, never read as the file's blocks)."""
    if spec.layer is None:
        return spec.name == "norm"
    hy = cfg.hybrid
    return spec.local_name in PLUS_ONE + ("in_proj_qkvz", "A_log", "conv1d") or _tiled(spec.local_name, hy) is not None


def _tiled(local: str, hy):
    return _TILED.get(local) if not hy.fused_projections and hy.num_value_heads != hy.num_key_heads else None


def read_hybrid(cfg, spec, raw: Callable[[str], Any]):
    """`spec`'s fp32 values with the converter's change undone, or None when it has none (read as
    stored). `raw(name)`: the fp32 values of the layer's (or global) tensor `name`, as the file holds them."""
    if not changed_by_converter(cfg, spec):
        return None
    if spec.layer is None:
        return raw("output_norm.weight") - 1.0
    local, hy = spec.local_name, cfg.hybrid
    if local in PLUS_ONE:
        return raw(HYBRID_LAYER[local]) - 1.0
    if local == "in_proj_qkvz":
        return _qkvz(raw(QKVZ_PARTS[0]), raw(QKVZ_PARTS[1]), hy)
    w = raw(HYBRID_LAYER[local])
    if local == "A_log":
        w = decay_log(w)
    tiled = _tiled(local, hy)
    if tiled is not None:
        w = _grouped_heads(w, local, tiled, hy)
    return w.reshape(spec.shape)


def _qkvz(qkv, z, hy):
    """Qwen3-Next's in_proj_qkvz rows (per key head: q, k, v, z) from the converter's two tensors."""
    import torch

    hk, dk, per = hy.num_key_heads, hy.key_head_dim, hy.value_dim // hy.num_key_heads
    q, k, v = qkv.split([hy.key_dim, hy.key_dim, hy.value_dim])
    parts = [q.reshape(hk, dk, -1), k.reshape(hk, dk, -1), v.reshape(hk, per, -1), z.reshape(hk, per, -1)]
    return torch.cat(parts, dim=1).reshape(-1, qkv.shape[1])


def _grouped_heads(w, local: str, tiled: tuple[int, int | None], hy):
    """Undo the converter's `_reorder_v_heads`: value heads back from tiled to grouped by key head
    (in_proj_qkv and the conv: only the v part after q and k)."""
    import torch

    dim, per_head = tiled
    per_head = per_head or hy.value_head_dim
    w = w.movedim(dim, 0)
    head = w[2 * hy.key_dim:] if local in ("in_proj_qkv", "conv1d") else w
    r = hy.num_value_heads // hy.num_key_heads
    grouped = head.reshape(r, hy.num_key_heads, per_head, *head.shape[1:]).transpose(0, 1).reshape(head.shape)
    if head.shape[0] != w.shape[0]:
        grouped = torch.cat([w[:2 * hy.key_dim], grouped])
    return grouped.movedim(0, dim).contiguous()


def decay_log(a, search_ulps: int = 8):
    """A_log from the converter's `ssm_a = -exp(A_log)` (float32): per element the float32 nearest
    log(-a) whose `-exp` in float32 is `a` again (torch's exp, as the forward computes it; the
    converter's own exp found such a value), else the nearest one."""
    import torch

    a = a.float()
    guess = torch.log(-a.double()).float()
    best, found = guess.clone(), torch.zeros_like(guess, dtype=torch.bool)
    for step in sorted(range(-search_ulps, search_ulps + 1), key=abs):
        cand = _ulps_away(guess, step)
        hit = ~found & (-cand.exp() == a)
        best, found = torch.where(hit, cand, best), found | hit
    return best


def _ulps_away(x, steps: int):
    import torch

    out = x
    toward = torch.full_like(x, float("inf") if steps > 0 else float("-inf"))
    for _ in range(abs(steps)):
        out = torch.nextafter(out, toward)
    return out
