"""`MLAConfig`: the DeepSeek-V2/V3/V3.2 attention facts beyond a LLaMA-like config (MoE: `moe_config`).

Read from an HF `config.json` of model_type `deepseek_v2`, `deepseek_v3` or `deepseek_v32` (the
fields of transformers' `DeepseekV2Config` / `DeepseekV3Config` / `DeepseekV32Config`). Torch-free: `ModelConfig` holds these
as plain data, and the weight list, the forward and the caches read them.

MLA (multi-head latent attention) caches per token one normalized latent of `kv_lora_rank`
values plus one shared rotary key of `qk_rope_head_dim` values; `kv_b_proj` expands the latent
into per-head keys (`qk_nope_head_dim`) and values (`v_head_dim`). DeepSeek-V3.2 adds a
lightning indexer: a small key of `index_head_dim` values per token, whose scores against the
query pick the `index_topk` latent entries each query attends to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32")


@dataclass(frozen=True, kw_only=True)
class MLAConfig:
    q_lora_rank: int  # 0: one plain q projection (DeepSeek-V2-Lite); else q_a -> norm -> q_b
    kv_lora_rank: int  # latent width cached per token
    qk_nope_head_dim: int  # per-head query/key width without rotary
    qk_rope_head_dim: int  # rotary width, shared key across heads
    v_head_dim: int  # per-head value width
    rope_interleave: bool = True  # rotary pairs (x0, x1), (x2, x3), ... as DeepSeek lays them out
    softmax_scale: float  # qk_head_dim ** -0.5, times yarn's mscale ** 2 when scaled
    # DeepSeek-V3.2 lightning indexer (0: none, every query attends to every cached entry)
    index_num_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def has_indexer(self) -> bool:
        return self.index_topk > 0

    @property
    def latent_width(self) -> int:
        """Values one token caches per layer: the latent and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_from_hf(hf: dict[str, Any], rope_scaling: dict[str, Any] | None) -> MLAConfig:
    """Raises KeyError naming a missing field (the caller turns it into a clear error)."""
    nope, rope = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"]
    scale = (nope + rope) ** -0.5
    if rope_scaling and rope_scaling.get("mscale_all_dim"):
        m = _yarn_mscale(rope_scaling["factor"], rope_scaling["mscale_all_dim"])
        scale *= m * m
    indexed = hf["model_type"] == "deepseek_v32"
    return MLAConfig(
        q_lora_rank=hf.get("q_lora_rank") or 0,
        kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=hf["v_head_dim"],
        # V2's and V3.2's attention always interleave; V3 says so in its config
        rope_interleave=bool(hf.get("rope_interleave", True)) if hf["model_type"] == "deepseek_v3" else True,
        softmax_scale=scale,
        index_num_heads=hf["index_n_heads"] if indexed else 0,
        index_head_dim=hf["index_head_dim"] if indexed else 0,
        index_topk=hf["index_topk"] if indexed else 0,
    )
