"""Config fields many families spell alike (torch-free): eos ids, RoPE settings in both the
transformers-4 (`rope_theta` + `rope_scaling`) and -5 (`rope_parameters`) spellings, and the
shape fields of an RMSNorm decoder."""

from __future__ import annotations

from typing import Any

from flexlamps.models.config import UnsupportedModelError


def eos_ids(hf: dict[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def rope(hf: dict[str, Any], allowed: tuple[str, ...] = ("linear", "llama3")) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None); an unknown rope type is an error naming it."""
    params = dict(hf.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = hf.get("rope_scaling") or params or None
    if scaling is not None:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.pop("type", "default"))
        scaling.pop("rope_theta", None)
        if scaling["rope_type"] == "default":
            scaling = None
    if scaling is not None and scaling["rope_type"] not in allowed:
        raise UnsupportedModelError(f"rope type {scaling['rope_type']!r} is not supported for "
                                    f"{hf.get('model_type')} ({', '.join(allowed)} are)")
    return theta, scaling


def rms_decoder_fields(hf: dict[str, Any]) -> dict[str, Any]:
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
        activation=hf.get("hidden_act", "silu"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids(hf),
    )
