"""Tiny random hybrid (gated DeltaNet + gated full attention) models in Hugging Face format, built
with transformers' own config classes: Qwen3-Next (MoE with a shared expert) and Qwen3.5 text
(dense MLP), each at two widths."""

from __future__ import annotations

from pathlib import Path

from tests.random_checkpoints import save_random_checkpoint

_NARROW = dict(hidden_size=48, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12)
_WIDE = dict(hidden_size=96, intermediate_size=160, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
             linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
             linear_conv_kernel_dim=3)
_MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)

HYBRID_CONFIGS = {
    # three DeltaNet layers, one full attention, MoE everywhere
    "qwen3_next": dict(model_type="qwen3_next", num_hidden_layers=4, **_NARROW, **_MOE),
    # full attention every 2nd layer, a dense layer among MoE ones, wider heads, kernel 3, GQA 4:1
    "qwen3_next_wide": dict(model_type="qwen3_next", num_hidden_layers=4, full_attention_interval=2,
                            mlp_only_layers=[1], **_WIDE, **_MOE),
    "qwen3_5_text": dict(model_type="qwen3_5_text", num_hidden_layers=4, **_NARROW),
    "qwen3_5_text_wide": dict(model_type="qwen3_5_text", num_hidden_layers=3,
                              layer_types=["linear_attention", "full_attention", "linear_attention"], **_WIDE),
}


def make_hybrid_model(folder: Path, kind: str, seed: int = 0, init_std: float = 0.2, **overrides) -> Path:
    """Save a random float32 model of `kind` (see HYBRID_CONFIGS; `overrides`: fields changed) with
    a tiny tokenizer into `folder`, its weights from N(0, init_std); transformers' decay rates
    (A_log, the log of U(0.01, 16)) kept."""
    import transformers

    spec = {**HYBRID_CONFIGS[kind], **overrides}
    cls = {"qwen3_next": transformers.Qwen3NextConfig,
           "qwen3_5_text": transformers.Qwen3_5TextConfig}[spec.pop("model_type")]
    return save_random_checkpoint(folder, lambda ids: cls(**{**ids, "max_position_embeddings": 512, **spec}),
                                  seed=seed, init_std=init_std, keep=("A_log",))


def add_mtp_tensors(folder: Path) -> Path:
    """Give the checkpoint in `folder` a multi-token-prediction block as Qwen3-Next / Qwen3.5 ship it
    (top-level `mtp.*`: fc, its two input norms, a final norm and one full-attention layer, here a copy
    of the last full-attention layer): llama.cpp's converter requires one; transformers and our
    loader skip it."""
    import json

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
