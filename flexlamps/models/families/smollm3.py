"""SmolLM3: LLaMA's layer without rotation on every `no_rope_layer_interval`-th layer (`no_rope_layers`:
1 rotates, 0 does not), biases as LLaMA's, a sliding window on the layers `layer_types` names."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families.decoder_layout import decoder_hf_name, decoder_specs
from flexlamps.models.families.family import Family
from flexlamps.models.families.hf_fields import decoder_model, sliding_layers
from flexlamps.models.families.llama import SHAPE_FIELDS
from flexlamps.models.layer_config import AttentionConfig
from flexlamps.models.weight_specs import WeightSpec


def _from_smollm3(hf: dict[str, Any]) -> ModelConfig:
    layers = hf["num_hidden_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    rotates = hf.get("no_rope_layers")
    if rotates is None:
        rotates = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(rotates) != layers or any(r not in (0, 1) for r in rotates):
        raise UnsupportedModelError(f"no_rope_layers must hold a 0 or 1 for each of the {layers} layers")
    window, window_layers = None, ()
    if hf.get("use_sliding_window"):  # transformers' default: the layers that do not rotate
        window, window_layers = sliding_layers(hf, [not r for r in rotates])
    bias = bool(hf.get("attention_bias", False))
    attention = AttentionConfig(rope_layers=tuple(bool(r) for r in rotates), o_bias=bias, window=window,
                                window_layers=window_layers)
    return decoder_model(hf, attention=attention, qkv_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)))


def hf_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    return decoder_hf_name(spec)


FAMILY = Family(
    name="smollm3", model_types=("smollm3",), forward="decoder", parse=_from_smollm3, weights=decoder_specs,
    hf_name=hf_name, gguf_architectures=("smollm3",), examples="SmolLM3-3B",
    reads=SHAPE_FIELDS | {"attention_bias", "mlp_bias", "no_rope_layers", "no_rope_layer_interval", "layer_types",
                          "sliding_window", "use_sliding_window"})
