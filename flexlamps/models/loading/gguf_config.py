"""A GGUF file's metadata as the HF config.json fields our family parsers read (torch-free),
meaning what llama.cpp runs from it: LLaMA / Mistral ("llama"), Qwen2, Qwen3, SmolLM3, Granite,
Gemma-2, Gemma-3 (text), Phi-3 and the LLaMA-like MoE families (`gguf_moe`),
under the keys llama.cpp's convert_hf_to_gguf.py writes.

Where llama.cpp fixes a value the file does not carry, the config says the same: SmolLM3 skips the
rotation on every fourth layer; Gemma's softmax scale is head_dim ** -0.5 (hidden / heads for the
27B shapes, as `query_pre_attn_scalar` is there), its window pattern 2 (Gemma-2) or 6 (Gemma-3)
unless `attention.sliding_window_pattern` says; Granite without `attention.scale` scales by
head_dim ** -0.5. A key we cannot apply is refused by name.
"""

from __future__ import annotations

from typing import Any, Callable

from flexlamps.models.config import UnsupportedModelError
from flexlamps.models.loading.gguf_moe import moe_hf_fields

# what llama.cpp does without the key (llama-hparams.h, src/models/gemma*.cpp)
_GEMMA2_SOFTCAPS = (50.0, 30.0)  # attention, final logits
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # layer counts llama.cpp takes for the 27B shapes
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
_SMOLLM3_NO_ROPE_STEP = 4
_YARN_KEYS = {"yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow"}
_REFUSED_ROPE_KEYS = ("rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor",
                      "rope.scaling.yarn_log_multiplier")


def decoder_hf_config(f: dict[str, Any], tensor_types: dict[str, str],
                      tensor_values: Callable[[str], list[float]]) -> dict[str, Any]:
    """The HF config of a llama.cpp architecture in `DECODER_ARCHITECTURES` (its MoE fields from
    `gguf_moe`); `tensor_values` reads a small tensor's values (Phi-3's rope factors)."""
    arch = f["general.architecture"]
    f = as_written(f)
    cfg = _shape_fields(arch, f, tensor_types)
    cfg.update(_rope_fields(arch, f))
    cfg.update(DECODER_ARCHITECTURES[arch](arch, f, tensor_types, cfg, tensor_values))
    return {**cfg, **moe_hf_fields(arch, f, cfg, tensor_types)}


def as_written(fields: dict[str, Any]) -> dict[str, Any]:
    """The metadata with each float32 number as the decimal it was written from (the shortest one
    that rounds to it: 1e-06, not 9.999999974752427e-07), so the config equals the HF folder's."""
    import numpy as np

    def decimal(v):
        return float(str(np.float32(v))) if isinstance(v, float) and float(np.float32(v)) == v else v

    return {k: decimal(v) for k, v in fields.items()}


def _shape_fields(a: str, f: dict[str, Any], types: dict[str, str]) -> dict[str, Any]:
    heads = f[f"{a}.attention.head_count"]
    return {
        "vocab_size": f.get(f"{a}.vocab_size", len(f["tokenizer.ggml.tokens"])),
        "hidden_size": f[f"{a}.embedding_length"], "num_hidden_layers": f[f"{a}.block_count"],
        "num_attention_heads": heads, "num_key_value_heads": f.get(f"{a}.attention.head_count_kv", heads),
        "head_dim": f.get(f"{a}.attention.key_length"), "intermediate_size": f[f"{a}.feed_forward_length"],
        "max_position_embeddings": f.get(f"{a}.context_length", 2048),
        "rms_norm_eps": f.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6),
        "tie_word_embeddings": "output.weight" not in types,
        "attention_bias": "blk.0.attn_q.bias" in types, "mlp_bias": "blk.0.ffn_up.bias" in types,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"), "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
    }


def _rope_fields(a: str, f: dict[str, Any]) -> dict[str, Any]:
    """rope_parameters from `rope.freq_base` and `rope.scaling.*` (none, linear, yarn)."""
    for key in _REFUSED_ROPE_KEYS:
        if f"{a}.{key}" in f:
            raise UnsupportedModelError(f"GGUF key {a}.{key} is not supported (llama.cpp's YaRN factors differ "
                                        "from transformers'); give the model's Hugging Face folder")
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(f.get(f"{a}.rope.freq_base", 10000.0))}
    kind = f.get(f"{a}.rope.scaling.type", "none")
    if kind == "linear":
        params.update(rope_type="linear", factor=float(f[f"{a}.rope.scaling.factor"]))
    elif kind == "yarn":
        params.update(rope_type="yarn", factor=float(f[f"{a}.rope.scaling.factor"]),
                      original_max_position_embeddings=f[f"{a}.rope.scaling.original_context_length"])
        params.update({ours: float(f[f"{a}.rope.scaling.{key}"]) for key, ours in _YARN_KEYS.items()
                       if f"{a}.rope.scaling.{key}" in f})
    elif kind != "none" and not (kind == "longrope" and a == "phi3"):
        raise UnsupportedModelError(f"GGUF {a}.rope.scaling.type {kind!r} is not supported (none, linear, yarn are)")
    return {"rope_parameters": params}


def _same_biases(a: str, types: dict[str, str]) -> None:
    """transformers' LLaMA / Qwen3 / SmolLM3 bias q, k, v and o together: one without the other is another model."""
    if ("blk.0.attn_q.bias" in types) != ("blk.0.attn_output.bias" in types):
        raise UnsupportedModelError(f"GGUF {a}: biases on q/k/v without one on the output projection (or the reverse) "
                                    "are not a layout flexlamps runs")


def _llama(a, f, types, cfg, values) -> dict[str, Any]:
    if "rope_freqs.weight" in types:  # llama.cpp's form of Llama-3.1's rope scaling
        raise UnsupportedModelError("GGUF tensor rope_freqs.weight (llama.cpp's rope scaling factors) is not read; "
                                    "give the model's Hugging Face folder")
    if a != "qwen2":
        _same_biases(a, types)
    return {"model_type": a}


def _qwen3(a, f, types, cfg, values) -> dict[str, Any]:
    _same_biases(a, types)
    return {"model_type": "qwen3"}


def _smollm3(a, f, types, cfg, values) -> dict[str, Any]:
    _same_biases(a, types)
    return {"model_type": "smollm3", "no_rope_layer_interval": _SMOLLM3_NO_ROPE_STEP}


def _granite(a, f, types, cfg, values) -> dict[str, Any]:
    _same_biases(a, types)
    head_dim = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    return {"model_type": "granite", "attention_multiplier": f.get(f"{a}.attention.scale", head_dim ** -0.5),
            "embedding_multiplier": f.get(f"{a}.embedding_scale", 1.0),
            "residual_multiplier": f.get(f"{a}.residual_scale", 1.0), "logits_scaling": f[f"{a}.logit_scale"]}


def _gemma(a, f, types, cfg, values) -> dict[str, Any]:
    """Gemma-2 / Gemma-3: llama.cpp's softmax scale, window pattern, softcaps and the two ropes."""
    if "blk.0.attn_q.bias" in types:
        raise UnsupportedModelError(f"GGUF {a}: attention biases are not read for Gemma")
    if a == "gemma2" and "output.weight" in types:  # llama.cpp's Gemma-2 always ties its head to token_embd
        raise UnsupportedModelError(f"GGUF {a}: output.weight is not read (llama.cpp's Gemma-2 ties the head to "
                                    "token_embd.weight); give the model's Hugging Face folder")
    layers, head_dim = cfg["num_hidden_layers"], cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if layers == _GEMMA_27B_LAYERS[a] else head_dim
    out = {"model_type": "gemma2" if a == "gemma2" else "gemma3_text", "query_pre_attn_scalar": scalar,
           "hidden_activation": "gelu_pytorch_tanh"}
    window = f.get(f"{a}.attention.sliding_window", 4096 if a == "gemma2" else 0)
    if window:
        out.update(sliding_window=window, layer_types=_swa_layer_types(a, f, layers))
    global_rope = cfg["rope_parameters"]
    local_theta = float(f.get(f"{a}.rope.freq_base_swa", global_rope["rope_theta"] if a == "gemma2" else 10000.0))
    if a == "gemma2":
        if local_theta != global_rope["rope_theta"]:
            raise UnsupportedModelError(f"GGUF {a}.rope.freq_base_swa differs from rope.freq_base; "
                                        "Gemma-2 has one rope")
        soft = (f.get(f"{a}.attn_logit_softcapping", _GEMMA2_SOFTCAPS[0]),
                f.get(f"{a}.final_logit_softcapping", _GEMMA2_SOFTCAPS[1]))
        return {**out, "attn_logit_softcapping": soft[0], "final_logit_softcapping": soft[1]}
    out["rope_parameters"] = {"full_attention": global_rope,
                              "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}
    return {**out, "final_logit_softcapping": f.get(f"{a}.final_logit_softcapping") or None}


def _swa_layer_types(a: str, f: dict[str, Any], layers: int) -> list[str]:
    """Which layers slide, as llama.cpp's `load_swa_pattern`: a per-layer array, or every layer but
    each n-th (`attention.sliding_window_pattern`, else Gemma's default n)."""
    pattern = f.get(f"{a}.attention.sliding_window_pattern", _SWA_PATTERN[a])
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise UnsupportedModelError(f"GGUF {a}.attention.sliding_window_pattern lists {len(pattern)} layers "
                                        f"of {layers}")
        slides = [bool(p) for p in pattern]
    else:
        slides = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    return ["sliding_attention" if s else "full_attention" for s in slides]


def _phi3(a, f, types, cfg, values) -> dict[str, Any]:
    """Phi-3: stacked q/k/v and gate/up, partial rotation, LongRoPE from rope_factors_long / _short."""
    head_dim = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = dict(cfg["rope_parameters"])
    rotated = f.get(f"{a}.rope.dimension_count", head_dim)
    if rotated != head_dim:
        rope["partial_rotary_factor"] = rotated / head_dim
    out = {"model_type": "phi3", "sliding_window": f.get(f"{a}.attention.sliding_window") or None}
    original = f.get(f"{a}.rope.scaling.original_context_length")
    if original is not None:
        out["original_max_position_embeddings"] = original
    if "rope_factors_long.weight" in types:
        rope.update(rope_type="longrope", long_factor=values("rope_factors_long.weight"),
                    short_factor=values("rope_factors_short.weight"), original_max_position_embeddings=original)
        attn = f.get(f"{a}.rope.scaling.attn_factor")
        if attn is not None and abs(attn - _longrope_attention(cfg["max_position_embeddings"], original)) > 1e-6:
            rope["attention_factor"] = attn
    return {**out, "rope_parameters": rope}


def _longrope_attention(context: int, original: int) -> float:
    """transformers' (and llama.cpp's converter's) LongRoPE attention factor for these lengths."""
    import math

    scale = context / original
    return math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0


def _moe(a, f, types, cfg, values) -> dict[str, Any]:
    return {}  # gguf_moe.moe_hf_fields gives the model_type and the rest


# llama.cpp's architecture -> its config fields beside the shared ones
DECODER_ARCHITECTURES: dict[str, Callable[..., dict[str, Any]]] = {
    "llama": _llama, "qwen2": _llama, "qwen3": _qwen3, "smollm3": _smollm3, "granite": _granite,
    "gemma2": _gemma, "gemma3": _gemma, "phi3": _phi3,
    "qwen2moe": _moe, "qwen3moe": _moe, "olmoe": _moe, "glm4moe": _moe,
}
