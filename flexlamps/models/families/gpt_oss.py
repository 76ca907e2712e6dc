"""gpt-oss (20B, 120B): attention with q/k/v/o biases, a learned sink logit per head, sliding
window on alternate layers (`layer_types`), YaRN rope; every layer a MoE FFN whose router has a
bias (top-k logits, softmax over those) and whose experts are clamped SwiGLU with biases.

The checkpoint keeps a layer's experts fused, one tensor per projection: dense `gate_up_proj`
(E, hidden, 2 * width) with gate and up interleaved along the last dim, `down_proj` (E, width,
hidden), or (as released) MXFP4 `*_blocks` / `*_scales` with outputs first; each expert is read
on its own (`hf_part`), MXFP4 ones kept 4-bit.
"""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model_fields, sliding_layers
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.families.moe_weights import ROUTER_TRAINING_FIELDS, ffn_shapes
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.moe_config import MoEConfig
from flexlamps.models.weight_specs import FusedPart, WeightSpec


def _from_gpt_oss(hf: dict[str, Any]) -> ModelConfig:
    n = hf["num_hidden_layers"]
    window, slides = sliding_layers(hf, [i % 2 == 0 for i in range(n)])
    bias = bool(hf.get("attention_bias", True))
    moe = MoEConfig(
        num_experts=hf["num_local_experts"], num_experts_per_token=hf["num_experts_per_tok"], num_shared_experts=0,
        moe_intermediate_size=hf["intermediate_size"], moe_layers=(True,) * n, router="topk_softmax",
        experts="clamped_swiglu", expert_bias=True, swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(hf.get("swiglu_limit", 7.0)))
    attention = AttentionConfig(sinks=True, o_bias=bias, window=window, window_layers=slides)
    return ModelConfig(**decoder_model_fields(hf, attention=attention, qkv_bias=bias, rope_types=("yarn",)), moe=moe)


def _specs(cfg: ModelConfig) -> list[WeightSpec]:
    return decoder_specs(cfg, ffn_shapes)


# expert projection -> (fused tensor, first output row, row stride): gate and up interleave
_FUSED = {"gate_proj": ("gate_up_proj", 0, 2), "up_proj": ("gate_up_proj", 1, 2), "down_proj": ("down_proj", 0, 1),
          "gate_bias": ("gate_up_proj_bias", 0, 2), "up_bias": ("gate_up_proj_bias", 1, 2),
          "down_bias": ("down_proj_bias", 0, 1)}


def hf_part(cfg: ModelConfig, spec: WeightSpec) -> FusedPart | None:
    if spec.layer is None or not spec.local_name.startswith("experts."):
        return None
    _, e, local = spec.local_name.split(".")
    tensor, start, stride = _FUSED[local]
    return FusedPart(f"model.layers.{spec.layer}.mlp.experts.{tensor}", int(e), start, stride,
                     transposed=local.endswith("_proj"))


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    part = hf_part(cfg, spec)
    if part is not None:  # the fused tensor it is read from
        return part.name
    if spec.layer is not None and spec.local_name in ("router", "router_bias"):
        return f"model.layers.{spec.layer}.mlp.router.{'bias' if spec.local_name == 'router_bias' else 'weight'}"
    return decoder_hf_name(spec)


FAMILY = Family(
    name="gpt_oss", model_types=("gpt_oss",), forward="decoder", parse=_from_gpt_oss, weights=_specs,
    hf_name=hf_name, hf_part=hf_part, gguf_architectures=("gpt-oss",),
    examples="gpt-oss-20b, gpt-oss-120b (MXFP4 experts kept 4-bit)",
    reads=SHAPE_FIELDS | ROUTER_TRAINING_FIELDS | {
        "num_local_experts", "num_experts_per_tok", "swiglu_alpha", "swiglu_limit", "sliding_window", "layer_types",
        "attention_bias", "quantization_config"})
