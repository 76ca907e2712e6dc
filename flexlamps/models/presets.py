"""Built-in models as config.json subsets, read by their families like any checkpoint's config.

`placement/model_presets.json` stores what they give (`placement.ModelSpec`s, each with its table
of every tensor), so `placement.model_preset` sizes them without the families (and without torch).
Rewrite it after changing a family or a preset: `python -m flexlamps.models.presets`; a test
keeps the file equal to what the families read now.
"""

from __future__ import annotations

import json
from pathlib import Path

import placement
from placement.presets import MODEL_PRESETS_PATH

from flexlamps.models.config import ModelConfig
from flexlamps.models.description import model_spec


def _opt(hidden: int, layers: int, heads: int) -> dict:
    return dict(model_type="opt", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, ffn_dim=4 * hidden, vocab_size=50272,
                max_position_embeddings=2048, torch_dtype="float16")


def _llama(hidden, layers, heads, kv_heads, ffn, vocab, dtype="float16", tie=False) -> dict:
    return dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads,
                intermediate_size=ffn, vocab_size=vocab, torch_dtype=dtype,
                tie_word_embeddings=tie)


_DEEPSEEK_V32_ATTN = dict(
    model_type="deepseek_v32", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, index_n_heads=64, index_head_dim=128, index_topk=2048,
    intermediate_size=18432, vocab_size=129280, torch_dtype="bfloat16")
_DEEPSEEK_V32_MOE = dict(n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1,
                         moe_intermediate_size=2048, first_k_dense_replace=3)

MODEL_CONFIGS: dict[str, dict] = {
    "opt-6.7b": _opt(4096, 32, 32),
    "opt-30b": _opt(7168, 48, 56),
    "opt-66b": _opt(9216, 64, 72),
    "opt-175b": _opt(12288, 96, 96),
    "llama-2-7b": _llama(4096, 32, 32, 32, 11008, 32000),
    "llama-2-13b": _llama(5120, 40, 40, 40, 13824, 32000),
    "llama-2-70b": _llama(8192, 80, 64, 8, 28672, 32000),
    "llama-3-8b": _llama(4096, 32, 32, 8, 14336, 128256, "bfloat16"),
    "llama-3-70b": _llama(8192, 80, 64, 8, 28672, 128256, "bfloat16"),
    "smollm2-135m": _llama(576, 30, 9, 3, 1536, 49152, "bfloat16", tie=True),
    # DeepSeek-V3.2's MLA + lightning-indexer attention with a dense FFN in every layer
    # (its first three layers' shape): the attention/cache path without the MoE weights.
    "deepseek-v3.2-attn": _DEEPSEEK_V32_ATTN,
    "deepseek-v3.2": dict(_DEEPSEEK_V32_ATTN, **_DEEPSEEK_V32_MOE),
    # as released: the same model in an FP8 checkpoint (128x128 tiles, fp32 scales)
    "deepseek-v3.2-exp": dict(_DEEPSEEK_V32_ATTN, **_DEEPSEEK_V32_MOE,
                              quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
}


def preset_specs() -> dict[str, placement.ModelSpec]:
    """Each preset as its family reads it."""
    return {name: model_spec(ModelConfig.from_hf(config), name=name) for name, config in MODEL_CONFIGS.items()}


def stored_text() -> str:
    """`placement/model_presets.json` as written: one model a line."""
    lines = [f"  {json.dumps(name)}: {spec.to_json(indent=None)}" for name, spec in preset_specs().items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


if __name__ == "__main__":
    Path(MODEL_PRESETS_PATH).write_text(stored_text())
    print(f"wrote {MODEL_PRESETS_PATH}")
