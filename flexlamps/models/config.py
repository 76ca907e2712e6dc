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

from flexlamps.models.errors import UnsupportedModelError
from flexlamps.models.families import family_for
from flexlamps.models.hf_field_types import wrong_field
from flexlamps.models.hybrid_config import HybridConfig
from flexlamps.models.layer_config import AttentionConfig, DecoderConfig, from_dict
from flexlamps.models.mla_config import MLAConfig
from flexlamps.models.moe_config import MoEConfig
from flexlamps.models.storage_config import StorageConfig, storage_from_hf


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    arch: str  # its family's forward (Family.forward): "decoder" (LLaMA-like), "opt", "mla" (DeepSeek) or "hybrid"
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
    attention: AttentionConfig = field(default_factory=AttentionConfig)  # scale, windows, q/k norm, rope per layer
    decoder: DecoderConfig = field(default_factory=DecoderConfig)  # norms, embedding and logit scales
    # OPT only
    do_layer_norm_before: bool = True
    word_embed_proj_dim: int | None = None
    activation: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # MLA only (head_dim is then the rotary width, as in transformers' DeepSeek configs)
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None  # None: every layer has the dense FFN
    hybrid: HybridConfig | None = None  # gated-DeltaNet layers beside full attention (Qwen3-Next, Qwen3.5)
    storage: StorageConfig = field(default_factory=StorageConfig)  # stored dtype, FP8 tiles, MXFP4 experts

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_kv_layers(self) -> int:
        """Layers that cache keys and values (a hybrid model's DeltaNet layers hold a state instead)."""
        return len(self.hybrid.full_layers) if self.hybrid is not None else self.num_layers

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes (MLA: latent and rotary key) one token holds in the cache, over all layers."""
        if self.mla is not None:
            return self.num_layers * self.mla.latent_width * dtype_bytes
        return 2 * self.num_kv_layers * self.kv_size * dtype_bytes

    def state_bytes_per_sequence(self, dtype_bytes: int) -> int:
        """Fixed bytes one sequence holds whatever its length (a hybrid model's DeltaNet states)."""
        if self.hybrid is None:
            return 0
        return len(self.hybrid.linear_layers) * self.hybrid.state_bytes_per_layer(dtype_bytes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        d = json.loads(text)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        d["attention"] = from_dict(AttentionConfig, d.get("attention"))
        d["decoder"] = from_dict(DecoderConfig, d.get("decoder"))
        d["storage"] = from_dict(StorageConfig, d.get("storage"))
        if d.get("mla"):
            d["mla"] = MLAConfig(**d["mla"])
        if d.get("moe"):
            d["moe"] = MoEConfig.from_dict(d["moe"])
        if d.get("hybrid"):
            d["hybrid"] = HybridConfig(**{**d["hybrid"], "layer_types": tuple(d["hybrid"]["layer_types"])})
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: dict[str, Any], source: str | None = None) -> "ModelConfig":
        """Build from an HF `config.json` dict; raises UnsupportedModelError naming the field, and
        `source` (the file the dict was read from) when given."""
        where = f"{source}: " if source else ""
        if not isinstance(hf, dict):
            raise UnsupportedModelError(f"{source or 'config.json'} must hold a JSON object, not {type(hf).__name__}")
        if (wrong := wrong_field(hf)) is not None:
            raise UnsupportedModelError(f"{where}{wrong}")
        model_type = hf.get("model_type")
        try:
            cfg = family_for(model_type).parse(hf)
        except KeyError as e:
            raise UnsupportedModelError(f"{source or 'config.json'} lacks the field {e.args[0]!r} needed for "
                                        f"{model_type}") from None
        except UnsupportedModelError as e:
            raise UnsupportedModelError(f"{where}{e}") from None
        except (TypeError, ValueError, ArithmeticError) as e:  # a field of a form no check above knows
            raise UnsupportedModelError(f"{where}a field's value has the wrong type or form ({e})") from None
        try:  # OPT checkpoints are fp16 where config.json names no dtype, the others bf16
            storage = storage_from_hf(hf, "fp16" if cfg.arch == "opt" else "bf16")
        except ValueError as e:
            raise UnsupportedModelError(f"{where}{e}") from None
        return dataclasses.replace(cfg, storage=storage)
