"""Tiny random mixture-of-experts checkpoints of every MoE family, saved by transformers' own
config and model classes (float32), at two widths and with any seed."""

from __future__ import annotations

from pathlib import Path

from tests.random_checkpoints import save_random_checkpoint

# per family: the config class name and its fields at the narrow width; "wide" doubles the
# hidden size and the expert widths (and uses more experts), so widths, not only seeds, vary
_ATTN = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
_MLA = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=256)
MOE_CONFIGS: dict[str, tuple[str, dict]] = {
    "mixtral": ("MixtralConfig", dict(hidden_size=64, intermediate_size=48, num_local_experts=6,
                                      num_experts_per_tok=2, **_ATTN)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
                                         mlp_only_layers=[1], **_ATTN)),
    "qwen2_moe_norm": ("Qwen2MoeConfig", dict(hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32, num_experts=6, num_experts_per_tok=3,
                                              norm_topk_prob=True, decoder_sparse_step=2, qkv_bias=False,
                                              tie_word_embeddings=True, **_ATTN)),
    # MLA (plain q, as V2-Lite) with DeepSeek-V2's greedy softmax router, two shared experts
    "deepseek_v2": ("DeepseekV2Config", dict(_MLA, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2,
                                             n_shared_experts=2, first_k_dense_replace=1, topk_method="greedy")),
    # low-rank q, group-limited routing (4 groups, 2 kept), scaled weights
    "deepseek_v2_grouped": ("DeepseekV2Config", dict(_MLA, q_lora_rank=48, n_routed_experts=8, num_experts_per_tok=3,
                                                     n_shared_experts=1, first_k_dense_replace=0, n_group=4,
                                                     topk_group=2, topk_method="group_limited_greedy",
                                                     routed_scaling_factor=2.0, tie_word_embeddings=True)),
    # Qwen3-MoE: per-head q/k norms, renormalized top-k, a dense layer off the sparse step
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=64, intermediate_size=80, moe_intermediate_size=32, head_dim=16,
                                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                         decoder_sparse_step=2, **_ATTN)),
    # OLMoE: q/k norms over the whole projection, top-k not renormalized, tied head
    "olmoe": ("OlmoeConfig", dict(hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                  tie_word_embeddings=True, **_ATTN)),
    # GLM-4.5: half-rotated heads, q/k norms, sigmoid router with correction bias and groups, a dense first layer
    "glm4_moe": ("Glm4MoeConfig", dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, head_dim=16,
                                       n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2,
                                       topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.5,
                                       use_qk_norm=True, attention_bias=True, **_ATTN)),
    # gpt-oss: alternating 6-token windows, sinks, YaRN, biased router, clamped SwiGLU experts
    "gpt_oss": ("GptOssConfig", dict(hidden_size=64, intermediate_size=32, head_dim=16, num_local_experts=6,
                                     num_experts_per_tok=2, sliding_window=6, swiglu_limit=1.5, **_ATTN)),
    # the same with its experts in MXFP4, as gpt-oss ships them (`to_mxfp4`), and a tied head
    "gpt_oss_mxfp4": ("GptOssConfig", dict(hidden_size=64, intermediate_size=32, head_dim=16, num_local_experts=6,
                                           num_experts_per_tok=2, sliding_window=6, tie_word_embeddings=True,
                                           **_ATTN)),
}
# the wide form of each: field -> value at the wide width
_WIDE = dict(hidden_size=96, intermediate_size=64, moe_intermediate_size=48, shared_expert_intermediate_size=64)


def config_fields(kind: str, wide: bool = False) -> tuple[str, dict]:
    cls_name, fields = MOE_CONFIGS[kind]
    fields = dict(fields)
    if wide:
        fields.update({k: v for k, v in _WIDE.items() if k in fields})
    return cls_name, fields


def make_moe_model(folder: Path, kind: str, seed: int = 0, wide: bool = False, **overrides) -> Path:
    """Save a random model of `kind` (see MOE_CONFIGS; `overrides`: fields changed) with a tiny
    tokenizer into `folder`.
    Weights are widened (normal, std 0.2) so logits differ and routing matters."""
    import transformers

    cls_name, fields = config_fields(kind, wide)
    cls = getattr(transformers, cls_name)
    save_random_checkpoint(folder, lambda ids: cls(**{**ids, **fields, **overrides}), seed=seed)
    if kind.endswith("_mxfp4"):
        to_mxfp4(folder, seed)
    return folder


def to_mxfp4(folder: Path, seed: int = 0) -> None:
    """Rewrite a gpt-oss checkpoint's fused experts as gpt-oss ships them: random MXFP4 codes
    (`<name>_blocks` (E, out, in / 32, 16), e8m0 `<name>_scales` (E, out, in / 32)) whose values
    are about as wide as the other weights, and `quantization_config` mxfp4."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors, g = load_file(str(path)), torch.Generator().manual_seed(seed)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = tensors.pop(name).shape  # dense: (E, in, out)
        tensors[name + "_blocks"] = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), generator=g,
                                                  dtype=torch.uint8)
        tensors[name + "_scales"] = torch.randint(121, 125, (experts, outputs, inputs // 32), generator=g,
                                                  dtype=torch.uint8)
    save_file(tensors, str(path), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(cfg))
