"""Every tiny random checkpoint the tests make, from one table and one builder.

`CHECKPOINTS[kind]` holds the config fields of a kind (model_type among them) at its narrow width;
`WIDE[kind]` the fields that change at the wide width, where a kind has one. `make_checkpoint(folder,
kind or fields, seed, ...)` saves a tiny tokenizer and the model transformers builds from its own
config class (`AutoConfig.for_model`), every weight drawn from N(0, init_std) after the seed
(transformers' init is too small for logits to differ and routing to matter), in Hugging Face format.
`GROUPS` names the kinds by what they exercise (the checkpoint zoo's names).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import save_tiny_tokenizer

# buffers drawn with the weights: DeepSeek-V3 / GLM-4.5's routing bias (zeros would leave the
# sigmoid router's correction untested)
WIDENED_BUFFERS = ("e_score_correction_bias",)
# parameters left as transformers draws them, by model_type: DeltaNet's decay rates (A_log, the
# log of U(0.01, 16)) widened would make the recurrent state blow up
KEPT = {"qwen3_next": ("A_log",), "qwen3_5_text": ("A_log",)}

# dense shapes: head_dim = hidden / heads at both widths, so classes without a head_dim field agree
_NARROW = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_DENSE_WIDE = dict(hidden_size=96, intermediate_size=160, num_attention_heads=6, num_key_value_heads=3, head_dim=16)
# what every dense family's checkpoint sets beyond its own options (no pad id, an untied head unless asked)
DENSE_DEFAULTS = dict(max_position_embeddings=128, pad_token_id=None, tie_word_embeddings=False)
_DENSE = dict(_NARROW, **DENSE_DEFAULTS)
_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 5.0, 9.0],
             "original_max_position_embeddings": 16, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
_ATTN = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
_MLA = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
            qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=256)
_DS_MOE = dict(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
               n_group=2, topk_group=1, routed_scaling_factor=2.5)
_MANY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256)
_HYBRID = dict(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
               max_position_embeddings=512)
_HYBRID_WIDE = dict(_HYBRID, hidden_size=96, intermediate_size=160, num_key_value_heads=1, head_dim=32,
                    linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
                    linear_conv_kernel_dim=3)
_HYBRID_MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)

# the dense families, every option each one's checkpoint turns on (windows of 5-6 keys: 28 tokens cross
# them): a family's entry here is its test (parity with transformers, support claims, plans, the zoo)
DENSE_FAMILIES: dict[str, dict] = {
    "llama_bias": dict(_DENSE, model_type="llama", num_hidden_layers=2, attention_bias=True, mlp_bias=True,
                       rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                        "rope_theta": 10000.0}),
    "mistral_window": dict(_DENSE, model_type="mistral", num_hidden_layers=2, sliding_window=5),
    "qwen2_window": dict(_DENSE, model_type="qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=5,
                         max_window_layers=1),
    "qwen3": dict(_DENSE, model_type="qwen3", num_hidden_layers=2, attention_bias=True,
                  rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
    "gemma2": dict(_DENSE, model_type="gemma2", num_hidden_layers=3, sliding_window=6, query_pre_attn_scalar=24,
                   attn_logit_softcapping=3.0, final_logit_softcapping=4.0),
    "gemma3_text": dict(_DENSE, model_type="gemma3_text", num_hidden_layers=3, sliding_window=5,
                        query_pre_attn_scalar=24,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
    "phi3": dict(_DENSE, model_type="phi3", num_hidden_layers=2, sliding_window=7, max_position_embeddings=64,
                 rope_parameters=_LONGROPE),
    "smollm3": dict(_DENSE, model_type="smollm3", num_hidden_layers=3, no_rope_layer_interval=2, attention_bias=True),
    "granite": dict(_DENSE, model_type="granite", num_hidden_layers=2, embedding_multiplier=3.0,
                    attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.5),
    "ernie4_5": dict(_DENSE, model_type="ernie4_5", num_hidden_layers=2, use_bias=True,
                     rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
    "olmo2": dict(_DENSE, model_type="olmo2", num_hidden_layers=2, attention_bias=True,
                  rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}),
}

CHECKPOINTS: dict[str, dict] = {
    # -- small LLaMA / Qwen2 / OPT models (class defaults kept: pad id, tie) ---------------------------
    "llama_gqa": dict(model_type="llama", hidden_size=64, intermediate_size=112, num_hidden_layers=3,  # GQA
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=50000.0, max_position_embeddings=128),
    "llama3_scaled": dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,  # MHA
                          num_attention_heads=4, num_key_value_heads=4, rope_theta=500000.0,
                          max_position_embeddings=128,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,  # qkv bias, tied
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=128),
    "opt": dict(model_type="opt", hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                word_embed_proj_dim=64, max_position_embeddings=128),
    # head_dim apart from hidden / heads (8 heads of 16 on a hidden of 64): the sizes follow head_dim
    "mistral_head_dim": dict(model_type="mistral", hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                             num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=128),
    **DENSE_FAMILIES,
    # -- mixture-of-experts families ------------------------------------------------------------------
    "mixtral": dict(model_type="mixtral", hidden_size=64, intermediate_size=48, num_local_experts=6,
                    num_experts_per_tok=2, **_ATTN),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, mlp_only_layers=[1],
                      **_ATTN),
    "qwen2_moe_norm": dict(model_type="qwen2_moe", hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
                           shared_expert_intermediate_size=32, num_experts=6, num_experts_per_tok=3,
                           norm_topk_prob=True, decoder_sparse_step=2, qkv_bias=False, tie_word_embeddings=True,
                           **_ATTN),
    # MLA (plain q, as V2-Lite) with DeepSeek-V2's greedy softmax router, two shared experts
    "deepseek_v2": dict(_MLA, model_type="deepseek_v2", num_hidden_layers=3, q_lora_rank=None, n_routed_experts=8,
                        moe_intermediate_size=32, num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
                        topk_method="greedy"),
    # low-rank q, group-limited routing (4 groups, 2 kept), scaled weights
    "deepseek_v2_grouped": dict(_MLA, model_type="deepseek_v2", num_hidden_layers=3, q_lora_rank=48,
                                moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
                                n_shared_experts=1, first_k_dense_replace=0, n_group=4, topk_group=2,
                                topk_method="group_limited_greedy", routed_scaling_factor=2.0,
                                tie_word_embeddings=True),
    # Qwen3-MoE: per-head q/k norms, renormalized top-k, a dense layer off the sparse step
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
                      head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
                      **_ATTN),
    # OLMoE: q/k norms over the whole projection, top-k not renormalized, tied head
    "olmoe": dict(model_type="olmoe", hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  tie_word_embeddings=True, **_ATTN),
    # GLM-4.5: half-rotated heads, q/k norms, sigmoid router with correction bias and groups, a dense first layer
    "glm4_moe": dict(model_type="glm4_moe", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                     head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2,
                     topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.5, use_qk_norm=True,
                     attention_bias=True, **_ATTN),
    # gpt-oss: alternating 6-token windows, sinks, YaRN, biased router, clamped SwiGLU experts
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=64, intermediate_size=32, head_dim=16, num_local_experts=6,
                    num_experts_per_tok=2, sliding_window=6, swiglu_limit=1.5, **_ATTN),
    # the same with its experts in MXFP4, as gpt-oss ships them (`to_mxfp4`), and a tied head
    "gpt_oss_mxfp4": dict(model_type="gpt_oss", hidden_size=64, intermediate_size=32, head_dim=16,
                          num_local_experts=6, num_experts_per_tok=2, sliding_window=6, tie_word_embeddings=True,
                          **_ATTN),
    # -- DeepSeek-V3 / V3.2 ---------------------------------------------------------------------------
    # MoE after one dense layer, q low-rank, interleaved rope, YaRN scaling (as V3 ships)
    "deepseek_v3": dict(_MLA, **_DS_MOE, model_type="deepseek_v3", num_hidden_layers=3, num_key_value_heads=4,
                        q_lora_rank=48, first_k_dense_replace=1,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 64, "beta_fast": 32,
                                         "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # dense FFN everywhere, plain q projection, half-split rope (V2-Lite-like)
    "deepseek_v3_dense": dict(_MLA, model_type="deepseek_v3", num_hidden_layers=2, num_key_value_heads=4,
                              q_lora_rank=None, first_k_dense_replace=2, rope_interleave=False),
    # V3.2: lightning indexer picking 8 entries, MoE; 16 indexer heads make an exact tie of
    # scores (all heads relu to 0) rare: transformers breaks such ties arbitrarily, we by position
    "deepseek_v32": dict(_MLA, **_DS_MOE, model_type="deepseek_v32", num_hidden_layers=3, num_key_value_heads=4,
                         q_lora_rank=48, first_k_dense_replace=1, index_topk=8, index_head_dim=16, index_n_heads=16),
    # many small experts, top-2 of 32, in every layer: where reading only the routed ones matters
    "deepseek_v3_many_experts": dict(_MLA, **{**_DS_MOE, "n_routed_experts": 32, "n_group": 1, "topk_group": 1,
                                              "moe_intermediate_size": 64},
                                     model_type="deepseek_v3", num_hidden_layers=2, num_key_value_heads=4,
                                     q_lora_rank=None, first_k_dense_replace=0),
    # the same for the softmax routers: 32 experts of which each token picks 2, in every layer
    "mixtral_many_experts": dict(_MANY, model_type="mixtral", intermediate_size=64, num_local_experts=32,
                                 num_experts_per_tok=2),
    "qwen2_moe_many_experts": dict(_MANY, model_type="qwen2_moe", intermediate_size=96, moe_intermediate_size=64,
                                   num_experts=32, shared_expert_intermediate_size=32, num_experts_per_tok=2),
    # -- hybrids: gated DeltaNet + gated full attention -----------------------------------------------
    "qwen3_next": dict(_HYBRID, **_HYBRID_MOE, model_type="qwen3_next", num_hidden_layers=4),  # 3 DeltaNet, 1 full
    # full attention every 2nd layer, a dense layer among MoE ones, wider heads, kernel 3, GQA 4:1
    "qwen3_next_wide": dict(_HYBRID_WIDE, **_HYBRID_MOE, model_type="qwen3_next", num_hidden_layers=4,
                            full_attention_interval=2, mlp_only_layers=[1]),
    "qwen3_5_text": dict(_HYBRID, model_type="qwen3_5_text", num_hidden_layers=4),
    "qwen3_5_text_wide": dict(_HYBRID_WIDE, model_type="qwen3_5_text", num_hidden_layers=3,
                              layer_types=["linear_attention", "full_attention", "linear_attention"]),
}

GROUPS = {
    "tiny": ("llama_gqa", "llama3_scaled", "qwen2", "opt"),
    "family": tuple(DENSE_FAMILIES),
    "moe": ("mixtral", "qwen2_moe", "qwen2_moe_norm", "deepseek_v2", "deepseek_v2_grouped", "qwen3_moe", "olmoe",
            "glm4_moe", "gpt_oss", "gpt_oss_mxfp4"),
    "deepseek": ("deepseek_v3", "deepseek_v3_dense", "deepseek_v32"),
    "many_experts": ("deepseek_v3_many_experts", "mixtral_many_experts", "qwen2_moe_many_experts"),
    "hybrid": ("qwen3_next", "qwen3_next_wide", "qwen3_5_text", "qwen3_5_text_wide"),
}

# the wide width: the dense shapes above; a MoE kind doubles its hidden size and widens its experts
_MOE_WIDE = dict(hidden_size=96, intermediate_size=64, moe_intermediate_size=48, shared_expert_intermediate_size=64)
WIDE: dict[str, dict] = {
    **{kind: _DENSE_WIDE for kind in GROUPS["family"]},
    **{kind: {k: v for k, v in _MOE_WIDE.items() if k in CHECKPOINTS[kind]} for kind in GROUPS["moe"]},
}


def checkpoint_fields(kind: str, wide: bool = False) -> dict:
    """The config fields of `kind` (a copy), at the wide width when asked."""
    if wide and kind not in WIDE:
        raise KeyError(f"{kind} has no wide width")
    return {**CHECKPOINTS[kind], **(WIDE[kind] if wide else {})}


# the fields of the kinds written as llama.cpp's GGUFs (tests/decoder_gguf.py, tests/moe_gguf.py), less what
# a GGUF cannot say: a Gemma query_pre_attn_scalar other than head_dim, SmolLM3's no-rope interval other
# than 4, a window on qwen2; llama.cpp's qwen2moe / qwen3moe have no dense layers
GGUF_FIELDS: dict[str, dict] = {
    "llama_bias": checkpoint_fields("llama_bias"),  # q/k biases interleaved too; YaRN
    "qwen2": {**checkpoint_fields("qwen2_window"), "use_sliding_window": False},
    "qwen3": checkpoint_fields("qwen3"),
    "smollm3": {**checkpoint_fields("smollm3"), "no_rope_layer_interval": 4, "num_hidden_layers": 4},
    "granite": checkpoint_fields("granite"),
    "gemma2": {**checkpoint_fields("gemma2"), "query_pre_attn_scalar": 16},
    "gemma3_text": {**checkpoint_fields("gemma3_text"), "query_pre_attn_scalar": 16},
    "phi3": checkpoint_fields("phi3"),
}
# (Mixtral's experts 64 wide: its down experts' rows whole blocks of 32, so a file of quantized experts holds
# all of them quantized)
GGUF_MOE_OVERRIDES = {"mixtral": {"intermediate_size": 64}, "qwen2_moe": {"mlp_only_layers": []},
                      "qwen3_moe": {"decoder_sparse_step": 1}}


def make_checkpoint(folder: Path, kind: str | dict, seed: int = 0, *, wide: bool = False, tied: bool | None = None,
                    dtype: str = "float32", init_std: float = 0.2, **overrides) -> Path:
    """Save a random model into `folder`: of `kind` (a CHECKPOINTS name, at the wide width when
    asked) or of the config fields `kind` (model_type among them), with `overrides` (e.g. a
    vocab_size wider than the tokenizer's) and `tied` (the head tied to the embedding or not) on
    top; a `_mxfp4` kind's experts are then rewritten in MXFP4 (`to_mxfp4`)."""
    import torch
    import transformers

    if wide and not isinstance(kind, str):
        raise ValueError("make_checkpoint: wide=True takes a CHECKPOINTS name; config fields are built as given")
    fields = checkpoint_fields(kind, wide) if isinstance(kind, str) else dict(kind)
    fields.update(overrides)
    if tied is not None:
        fields["tie_word_embeddings"] = tied
    model_type = fields.pop("model_type")
    folder.mkdir(parents=True, exist_ok=True)
    ids = dict(vocab_size=save_tiny_tokenizer(folder), bos_token_id=0, eos_token_id=1)
    config = transformers.AutoConfig.for_model(model_type, **{**ids, **fields})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    keep = KEPT.get(model_type, ())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(keep):
                p.normal_(0.0, init_std)
        for name, b in model.named_buffers():
            if name.endswith(WIDENED_BUFFERS):
                b.normal_(0.0, init_std)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    if isinstance(kind, str) and kind.endswith("_mxfp4"):
        to_mxfp4(folder, seed)
    return folder


def to_mxfp4(folder: Path, seed: int = 0) -> None:
    """Rewrite a gpt-oss checkpoint's fused experts as gpt-oss ships them: random MXFP4 codes
    (`<name>_blocks` (E, out, in / 32, 16), e8m0 `<name>_scales` (E, out, in / 32)) whose values
    are about as wide as the other weights, and `quantization_config` mxfp4."""
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


def to_fp8_checkpoint(src: Path, dst: Path) -> dict:
    """Rewrite a dense checkpoint as DeepSeek-V3 ships it: 2-D projections in FP8 with 128x128
    `weight_scale_inv` tiles, quantization_config fp8; returns the dequantized dense weights."""
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


def add_mtp_tensors(folder: Path) -> Path:
    """Give the checkpoint in `folder` a multi-token-prediction block as Qwen3-Next / Qwen3.5 ship it
    (top-level `mtp.*`: fc, its two input norms, a final norm and one full-attention layer, here a copy
    of the last full-attention layer): llama.cpp's converter requires one; transformers and our
    loader skip it."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    hf = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    full = max(i for i, kind in enumerate(hf["layer_types"]) if kind == "full_attention")
    prefix, h = f"model.layers.{full}.", hf["hidden_size"]
    mtp = {f"mtp.layers.0.{name[len(prefix):]}": value for name, value in t.items() if name.startswith(prefix)}
    mtp["mtp.fc.weight"] = np.full((h, 2 * h), 0.01, np.float32)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = t["model.norm.weight"]
    save_file({**t, **mtp}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
