"""Where each of our weights lies in a GGUF file of a LLaMA-like architecture, under llama.cpp's
tensor names, and how llama.cpp's converter changed it on the way (torch-free).

Two changes are undone on reading: LLaMA-layout converters (llama, smollm3, granite; Mixtral as
"llama") interleave the rows of q and k (their weights and biases) for llama.cpp's rope; Gemma's
converter stores its `(1 + w)` norms as `w + 1` (read back as `value - 1` in fp32, which the norm's
`1 + w` turns back into the file's value exactly). Phi-3's stacked projections keep their names'
meaning: `attn_qkv` is q, k, v stacked, `ffn_up` is gate and up stacked.
"""

from __future__ import annotations

# our local name -> llama.cpp's tensor (after `blk.{i}.`)
GGUF_LAYER = {
    "attn_norm": "attn_norm.weight", "q_proj": "attn_q.weight", "k_proj": "attn_k.weight",
    "v_proj": "attn_v.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias",
    "o_proj": "attn_output.weight", "o_bias": "attn_output.bias", "mlp_norm": "ffn_norm.weight",
    "gate_proj": "ffn_gate.weight", "up_proj": "ffn_up.weight", "down_proj": "ffn_down.weight",
    "gate_bias": "ffn_gate.bias", "up_bias": "ffn_up.bias", "down_bias": "ffn_down.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
}
GGUF_GLOBAL = {"embed_tokens": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}

# where an architecture's names differ from LLaMA's, by our model_type
_OWN_NAMES = {
    # Gemma: the norm after attention, the pre-FFN norm (llama.cpp's ffn_norm) and the one after the FFN
    "gemma2": {"post_attn_norm": "post_attention_norm.weight", "post_mlp_norm": "post_ffw_norm.weight"},
    "phi3": {"qkv_proj": "attn_qkv.weight", "gate_up_proj": "ffn_up.weight"},
    # GLM-4.5 and gpt-oss: HF's post_attention_layernorm (our pre-FFN norm) keeps llama.cpp's name for it
    "glm4_moe": {"mlp_norm": "post_attention_norm.weight"},
    "gpt_oss": {"mlp_norm": "post_attention_norm.weight", "sinks": "attn_sinks.weight"},
}
_OWN_NAMES["gemma3_text"] = _OWN_NAMES["gemma2"]

PERMUTED_QK = ("llama", "mixtral", "smollm3", "granite")  # model_types whose q / k rows llama.cpp interleaves
_PERMUTED = ("q_proj", "k_proj", "q_bias", "k_bias")
NORM_PLUS_ONE = ("gemma2", "gemma3_text")  # model_types whose norms the converter stores as w + 1


def layer_names(model_type: str) -> dict[str, str]:
    """Our local name -> llama.cpp's tensor name (after `blk.{i}.`) for this model_type."""
    return {**GGUF_LAYER, **_OWN_NAMES.get(model_type, {})}


def permuted_heads(model_type: str, local_name: str, num_heads: int, num_kv_heads: int) -> int | None:
    """The head count whose rows llama.cpp's converter interleaved in this tensor, None if untouched."""
    if model_type not in PERMUTED_QK or local_name not in _PERMUTED:
        return None
    return num_heads if local_name.startswith("q_") else num_kv_heads
