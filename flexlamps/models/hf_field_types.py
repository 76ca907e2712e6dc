"""The JSON types of the config.json fields our families read, checked before any family parses
them: a count given as "two", a flag given as "false" (which Python would take as true) or a
norm epsilon given as a string is an error naming the field, never a failure deep in a layer.
Fields not listed here are checked by the family that reads them. Torch-free."""

from __future__ import annotations

from typing import Any

# sizes and counts a model cannot have zero of
POSITIVE_INTS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "ffn_dim", "word_embed_proj_dim", "num_experts_per_tok", "kv_lora_rank",
    "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
    "index_n_heads", "index_head_dim", "index_topk", "original_max_position_embeddings"})
# other integers (0 is meaningful or harmless: no shared expert, no dense first layers, ...)
INTS = frozenset({
    "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
    "num_local_experts", "n_routed_experts", "n_shared_experts", "n_group", "topk_group", "first_k_dense_replace",
    "max_window_layers", "full_attention_interval", "decoder_sparse_step", "moe_layer_freq", "sliding_window",
    "no_rope_layer_interval", "sliding_window_pattern"})
NUMBERS = frozenset({
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "partial_rotary_factor",
    "routed_scaling_factor", "residual_multiplier", "embedding_multiplier", "attention_multiplier", "logits_scaling",
    "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping", "rope_local_base_freq",
    "swiglu_limit", "swiglu_alpha"})
BOOLS = frozenset({
    "tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window", "do_layer_norm_before",
    "norm_topk_prob", "use_qk_norm", "enable_bias", "qkv_bias", "rope_interleave"})
STRINGS = frozenset({"model_type", "hidden_act", "activation_function", "topk_method"})
OBJECTS = frozenset({"rope_scaling", "rope_parameters", "quantization_config"})


def wrong_field(hf: dict[str, Any]) -> str | None:
    """The first field of `hf` whose value has the wrong type, described ("num_hidden_layers must be
    a positive integer, got 'two'"), or None. A null value is left to the family (often: unset)."""
    for name, value in hf.items():
        if value is None:
            continue
        need = _need(name, value)
        if need is not None:
            return f"{name} must be {need}, got {value!r}"
    return None


def _need(name: str, value: Any) -> str | None:
    """What `value` of field `name` should have been, or None when it is fine (or not ours to check)."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if name in POSITIVE_INTS:
        return None if is_int and value >= 1 else "a positive integer"
    if name in INTS:
        return None if is_int and value >= 0 else "an integer >= 0"
    if name in NUMBERS:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if name in BOOLS:
        return None if isinstance(value, bool) else "true or false"
    if name in STRINGS:
        return None if isinstance(value, str) else "a string"
    if name in OBJECTS:
        return None if isinstance(value, dict) else "a JSON object"
    return None
