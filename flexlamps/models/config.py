"""`ModelConfig`: the architecture facts our forward passes need, read from an HF `config.json`.

One dataclass covers both families we run (LLaMA-like and OPT); fields a family does not use
keep their defaults. Both the old (`rope_theta` + `rope_scaling`) and the transformers-5
(`rope_parameters`) spellings of RoPE settings are accepted.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from flexlamps.models.mla_config import DEEPSEEK_MODEL_TYPES, MLAConfig, MoEConfig, mla_from_hf, moe_from_hf

LLAMA_LIKE = {"llama", "mistral", "qwen2"}
SUPPORTED_MODEL_TYPES = sorted(LLAMA_LIKE | {"opt"} | set(DEEPSEEK_MODEL_TYPES))


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    arch: str  # "llama" (LLaMA, Mistral, Qwen2, SmolLM2, TinyLlama), "opt" or "mla" (DeepSeek-V3/V3.2)
    model_type: str  # the HF model_type it came from
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3"|"linear"|..., ...}
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    mlp_bias: bool = False
    # OPT only
    do_layer_norm_before: bool = True
    word_embed_proj_dim: int | None = None
    activation: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # MLA only (head_dim is then the rotary width, as in transformers' DeepSeek configs)
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None  # None: every layer has the dense FFN

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes (MLA: latent and rotary key) one token holds in the cache, over all layers."""
        if self.mla is not None:
            return self.num_layers * self.mla.latent_width * dtype_bytes
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        d = json.loads(text)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        if d.get("mla"):
            d["mla"] = MLAConfig(**d["mla"])
        if d.get("moe"):
            d["moe"] = MoEConfig(**{**d["moe"], "moe_layers": tuple(d["moe"]["moe_layers"])})
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from an HF `config.json` dict; raises UnsupportedModelError naming the field."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported; flexlamps runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        try:
            if model_type in DEEPSEEK_MODEL_TYPES:
                return _from_deepseek(hf)
            return _from_opt(hf) if model_type == "opt" else _from_llama(hf)
        except KeyError as e:
            raise UnsupportedModelError(f"config.json lacks the field {e.args[0]!r} needed for {model_type}") from None


def _eos_ids(hf: dict[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


def _rope(hf: dict[str, Any], allowed: tuple[str, ...] = ("linear", "llama3")) -> tuple[float, dict[str, Any] | None]:
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
        raise UnsupportedModelError(f"rope type {scaling['rope_type']!r} is not supported ({', '.join(allowed)} are)")
    return theta, scaling


def _from_llama(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("sliding_window") and hf.get("use_sliding_window", hf["model_type"] == "mistral"):
        # A window at least as long as the context never masks anything: safe to ignore.
        if hf["sliding_window"] < hf.get("max_position_embeddings", 0):
            raise UnsupportedModelError(
                f"sliding_window={hf['sliding_window']} is not supported; only full attention is"
            )
    heads = hf["num_attention_heads"]
    hidden = hf["hidden_size"]
    theta, scaling = _rope(hf)
    return ModelConfig(
        arch="llama",
        **_rms_decoder_fields(hf),
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        max_position=hf.get("max_position_embeddings", 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=bool(hf.get("attention_bias", hf["model_type"] == "qwen2")),
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )


def _rms_decoder_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The fields LLaMA-like and DeepSeek configs spell alike."""
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
        eos_token_ids=_eos_ids(hf),
    )


def _from_opt(hf: dict[str, Any]) -> ModelConfig:
    hidden = hf["hidden_size"]
    heads = hf["num_attention_heads"]
    proj = hf.get("word_embed_proj_dim", hidden)
    return ModelConfig(
        arch="opt",
        model_type="opt",
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=hf["ffn_dim"],
        max_position=hf.get("max_position_embeddings", 2048),
        norm_eps=1e-5,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        qkv_bias=bool(hf.get("enable_bias", True)),
        mlp_bias=bool(hf.get("enable_bias", True)),
        do_layer_norm_before=bool(hf.get("do_layer_norm_before", True)),
        word_embed_proj_dim=proj if proj != hidden else None,
        activation=hf.get("activation_function", "relu"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_ids(hf),
    )


def _from_deepseek(hf: dict[str, Any]) -> ModelConfig:
    if hf.get("attention_bias"):
        raise UnsupportedModelError("attention_bias=true is not supported for DeepSeek MLA models "
                                    "(no released checkpoint uses it)")
    theta, scaling = _rope(hf, allowed=("linear", "yarn"))
    return ModelConfig(
        arch="mla",
        **_rms_decoder_fields(hf),
        num_kv_heads=hf["num_attention_heads"],  # one latent serves every head
        head_dim=hf["qk_rope_head_dim"],  # the rotary width, as transformers sets head_dim
        max_position=hf.get("max_position_embeddings", 4096),
        rope_theta=theta,
        rope_scaling=scaling,
        mla=mla_from_hf(hf, scaling),
        moe=moe_from_hf(hf),
    )
