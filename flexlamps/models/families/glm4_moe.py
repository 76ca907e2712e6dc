"""GLM-4.5 / GLM-4.6 (`glm4_moe`): a LLaMA-like decoder with q/k/v biases, half of each head
rotated (`partial_rotary_factor`; 0.5 when the config names none, as transformers defaults),
optional per-head q/k norms; after `first_k_dense_replace` dense layers, DeepSeek-V3's sigmoid
router (correction bias, groups) over routed experts, plus shared experts."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model_fields
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.families.moe_weights import ROUTER_TRAINING_FIELDS, deepseek_moe_name
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.moe_config import moe_from_hf
from flexlamps.models.weight_specs import WeightSpec


def _from_glm4_moe(hf: dict[str, Any]) -> ModelConfig:
    if "partial_rotary_factor" not in (hf.get("rope_parameters") or {}) and "partial_rotary_factor" not in hf:
        hf = {**hf, "partial_rotary_factor": 0.5}  # transformers' default for glm4_moe
    if not hf.get("n_routed_experts"):
        raise UnsupportedModelError("glm4_moe needs n_routed_experts > 0 (a dense GLM is model_type glm4)")
    attention = AttentionConfig(qk_norm=bool(hf.get("use_qk_norm", False)))
    # attention_bias: q, k and v only (GLM's o_proj never has one)
    fields = decoder_model_fields(hf, attention=attention, qkv_bias=bool(hf.get("attention_bias", False)))
    return ModelConfig(**fields, moe=moe_from_hf(hf))


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec, deepseek_moe_name)


FAMILY = Family(
    name="glm4_moe", model_types=("glm4_moe",), forward="decoder", parse=_from_glm4_moe, weights=decoder_specs,
    hf_name=hf_name, gguf_architectures=("glm4moe",), examples="GLM-4.5, GLM-4.5-Air, GLM-4.6",
    # num_mtp_layers: multi-token-prediction layers, unused to generate (as transformers)
    reads=SHAPE_FIELDS | ROUTER_TRAINING_FIELDS | {
        "attention_bias", "use_qk_norm", "partial_rotary_factor", "moe_intermediate_size", "num_experts_per_tok",
        "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "n_group", "topk_group",
        "first_k_dense_replace", "norm_topk_prob", "num_mtp_layers", "num_nextn_predict_layers"})
