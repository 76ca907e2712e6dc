"""Tiny random DeepSeek-V3 / V3.2 models saved in Hugging Face format (built with transformers)."""

from __future__ import annotations

from pathlib import Path

from tests.random_checkpoints import save_random_checkpoint

_MLA = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
            kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            max_position_embeddings=256)
_MOE = dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
            n_group=2, topk_group=1, routed_scaling_factor=2.5)

DEEPSEEK_CONFIGS = {
    # MoE after one dense layer, q low-rank, interleaved rope, YaRN scaling (as V3 ships)
    "deepseek_v3": dict(model_type="deepseek_v3", num_hidden_layers=3, q_lora_rank=48,
                        first_k_dense_replace=1, **_MLA, **_MOE,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 64, "beta_fast": 32,
                                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # dense FFN everywhere, plain q projection, half-split rope (V2-Lite-like)
    "deepseek_v3_dense": dict(model_type="deepseek_v3", num_hidden_layers=2, q_lora_rank=None,
                              first_k_dense_replace=2, rope_interleave=False, **_MLA),
    # V3.2: lightning indexer picking 8 entries, MoE; 16 indexer heads make an exact tie of
    # scores (all heads relu to 0) rare: transformers breaks such ties arbitrarily, we by position
    "deepseek_v32": dict(model_type="deepseek_v32", num_hidden_layers=3, q_lora_rank=48,
                         first_k_dense_replace=1, index_topk=8, index_head_dim=16, index_n_heads=16,
                         **_MLA, **_MOE),
}


# many small experts, top-2 of 32, in every layer: where reading only the routed ones matters
MANY_EXPERTS = dict(model_type="deepseek_v3", num_hidden_layers=2, q_lora_rank=None, first_k_dense_replace=0,
                    **{**_MLA, **_MOE, "n_routed_experts": 32, "n_group": 1, "topk_group": 1,
                       "moe_intermediate_size": 64})


def make_deepseek_model(folder: Path, kind: str, seed: int = 0, dtype: str = "float32",
                        spec: dict | None = None) -> Path:
    """Save a random model of `kind` (see DEEPSEEK_CONFIGS; or the config `spec`, a vocab_size in
    it wider than the tokenizer's) with a tiny tokenizer into `folder`, its weights widened so
    logits differ and routing and selection matter."""
    import transformers

    spec = dict(spec or DEEPSEEK_CONFIGS[kind])
    cls = {"deepseek_v3": transformers.DeepseekV3Config,
           "deepseek_v32": transformers.DeepseekV32Config}[spec.pop("model_type")]
    return save_random_checkpoint(folder, lambda ids: cls(**{**ids, **spec}), seed=seed, dtype=dtype)


def to_fp8_checkpoint(src: Path, dst: Path) -> dict:
    """Rewrite a dense checkpoint as DeepSeek-V3 ships it: 2-D projections in FP8 with 128x128
    `weight_scale_inv` tiles, quantization_config fp8; returns the dequantized dense weights."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from quant.fp8 import dequantize_weight, quantize_weight

    shutil.copytree(src, dst)
    tensors, dense = load_file(str(dst / "model.safetensors")), {}
    for name in list(tensors):
        t = tensors[name]
        if t.dim() == 2 and "embed" not in name and "lm_head" not in name and ".gate." not in name:
            codes, scales = quantize_weight(t)
            tensors[name], tensors[name + "_scale_inv"] = codes, scales
            dense[name] = dequantize_weight(codes, scales, torch.float32)
        else:
            dense[name] = t
    save_file(tensors, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                  "activation_scheme": "dynamic"}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dense
