"""Config fields many families spell alike (torch-free): eos ids, RoPE settings in both the
transformers-4 (`rope_theta` + `rope_scaling`) and -5 (`rope_parameters`) spellings, and the
shape fields of an RMSNorm decoder."""

from __future__ import annotations

import dataclasses
from typing import Any

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.layer_config import ROPE_FIELDS, ROPE_TYPES, AttentionConfig, DecoderConfig


def eos_ids(hf: dict[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def rope(hf: dict[str, Any], allowed: tuple[str, ...] = ("linear", "llama3"),
         params: dict[str, Any] | None = None) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None); an unknown rope type, or one missing a field it needs, is an error
    naming it. `params`: one layer kind's rope parameters (Gemma-3's nested `rope_parameters`)."""
    explicit = params is not None
    params = dict(params if explicit else hf.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = params if explicit else hf.get("rope_scaling") or params
    if scaling:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.pop("type", "default"))
        scaling.pop("rope_theta", None)
        scaling.pop("partial_rotary_factor", None)
    if not scaling or scaling["rope_type"] == "default":
        return theta, None
    kind = scaling["rope_type"]
    if kind not in allowed:
        raise UnsupportedModelError(f"rope type {kind!r} is not supported for {hf.get('model_type')} "
                                    f"({', '.join(allowed)} are)")
    if kind in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in hf:  # Phi-3 keeps it beside them; transformers prefers it
            scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
        scaling.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    missing = [f for f in ROPE_FIELDS[kind] if scaling.get(f) is None]
    if missing:
        raise UnsupportedModelError(f"rope type {kind!r} of {hf.get('model_type')} needs {missing[0]!r} "
                                    "in its rope parameters")
    return theta, scaling


def rotary_dim(hf: dict[str, Any], head_dim: int) -> int | None:
    """The rotated width of a head when partial (`partial_rotary_factor` < 1), else None."""
    factor = (hf.get("rope_parameters") or {}).get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    dim = int(head_dim * float(factor))
    if dim == head_dim:
        return None
    if dim <= 0 or dim % 2:
        raise UnsupportedModelError(f"partial_rotary_factor={factor} gives {dim} rotated dims of {head_dim}; "
                                    "an even, positive width is needed")
    return dim


LAYER_TYPES = ("full_attention", "sliding_attention")


def sliding_layers(hf: dict[str, Any], default: list[bool]) -> tuple[int | None, tuple[bool, ...]]:
    """(window, which layers slide) from `sliding_window` and `layer_types` (or the family's
    `default` rule when the config has no layer_types); (None, ()) without a window. A layer type
    we do not run is an error naming it."""
    types = hf.get("layer_types")
    if types is not None:
        unknown = sorted({t for t in types if t not in LAYER_TYPES})
        if unknown:
            raise UnsupportedModelError(f"layer type {unknown[0]!r} of {hf.get('model_type')} is not supported "
                                        f"({', '.join(LAYER_TYPES)} are)")
        if len(types) != hf["num_hidden_layers"]:
            raise UnsupportedModelError(f"layer_types lists {len(types)} layers; num_hidden_layers is "
                                        f"{hf['num_hidden_layers']}")
        slides = tuple(t == "sliding_attention" for t in types)
    else:
        slides = tuple(default)
    window = hf.get("sliding_window")
    if window is None or not any(slides):
        return None, ()
    if not isinstance(window, int) or window < 1:
        raise UnsupportedModelError(f"sliding_window={window!r} must be a positive integer")
    return window, () if all(slides) else slides


def refuse_true(hf: dict[str, Any], *flags: str) -> None:
    """An error naming the first of `flags` the config turns on (options we do not run)."""
    for flag in flags:
        if hf.get(flag):
            raise UnsupportedModelError(f"{flag}={hf[flag]!r} is not supported for {hf.get('model_type')}")


def rms_decoder_fields(hf: dict[str, Any], activation_field: str = "hidden_act") -> dict[str, Any]:
    """The ModelConfig fields LLaMA-like and DeepSeek configs spell alike."""
    return dict(
        model_type=hf["model_type"],
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        activation=activation(hf, activation_field),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids(hf),
    )


ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # what blocks.activation computes for a gated MLP


def activation(hf: dict[str, Any], field: str) -> str:
    act = hf.get(field, "silu")
    act = "silu" if act == "swish" else act  # one function under two names (transformers' ACT2FN)
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(f"{field}={act!r} is not supported for {hf.get('model_type')} "
                                    f"({', '.join(ACTIVATIONS)} are)")
    return act


# config.json fields no transformers forward reads (training, bookkeeping, generation defaults)
INERT_FIELDS = frozenset({
    "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label", "is_encoder_decoder",
    "label2id", "output_hidden_states", "problem_type", "return_dict", "transformers_version", "model_type",
    "_name_or_path", "use_cache", "initializer_range", "attention_dropout", "pad_token_id", "bos_token_id",
    "eos_token_id",
})


def decoder_model(hf: dict[str, Any], **options) -> ModelConfig:
    """A `DecoderForward` model's ModelConfig (`decoder_model_fields`)."""
    return ModelConfig(**decoder_model_fields(hf, **options))


def decoder_model_fields(hf: dict[str, Any], *, attention: AttentionConfig | None = None,
                         decoder: DecoderConfig | None = None, qkv_bias: bool = False, mlp_bias: bool = False,
                         activation_field: str = "hidden_act",
                         rope_types: tuple[str, ...] = ROPE_TYPES) -> dict[str, Any]:
    """The ModelConfig fields of a `DecoderForward` model: the shape fields LLaMA-like configs share,
    the rope (partial rotation included), and the family's attention and decoder options (MoE
    families add `moe`)."""
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    head_dim = hf.get("head_dim") or hidden // heads
    theta, scaling = rope(hf, allowed=rope_types)
    attention = attention or AttentionConfig()
    dim = rotary_dim(hf, head_dim)
    if dim is not None:
        attention = dataclasses.replace(attention, rotary_dim=dim)
    return dict(
        arch="decoder",
        **rms_decoder_fields(hf, activation_field),
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        max_position=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=qkv_bias,
        mlp_bias=mlp_bias,
        attention=attention,
        decoder=decoder or DecoderConfig(),
    )
