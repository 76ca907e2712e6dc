"""A decoder layer's FFN tensors (dense or mixture-of-experts) as data, and their checkpoint
names in the layouts HF checkpoints use (torch-free; the families share them).

Local names as `blocks/moe.py` reads them: `router`, `router_bias`, `experts.{e}.gate_proj`
(one tensor per expert and projection, so each can be placed on its own tier), the shared
experts' `shared_*_proj` and `shared_expert_gate`. Role "router": a small matrix never
compressed (DeepSeek's runs in fp32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flexlamps.models.config import ModelConfig

Shapes = list[tuple[str, tuple[int, ...], str]]  # (local name, shape, role)
# MoE config fields only training reads: the load-balancing loss, router jitter, returning router logits
ROUTER_TRAINING_FIELDS = frozenset({"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"})

_PROJ = ("gate_proj", "up_proj", "down_proj")


def swiglu_shapes(prefix: str, h: int, f: int, bias: bool = False) -> Shapes:
    out = [(f"{prefix}gate_proj", (f, h), "linear"), (f"{prefix}up_proj", (f, h), "linear"),
           (f"{prefix}down_proj", (h, f), "linear")]
    if bias:
        out += [(f"{prefix}gate_bias", (f,), "bias"), (f"{prefix}up_bias", (f,), "bias"),
                (f"{prefix}down_bias", (h,), "bias")]
    return out


def is_moe_layer(cfg: "ModelConfig", layer: int) -> bool:
    return cfg.moe is not None and cfg.moe.moe_layers[layer]


def ffn_shapes(cfg: "ModelConfig", layer: int) -> Shapes:
    """The FFN tensors of `layer`: the dense SwiGLU (with biases when `mlp_bias`) or the MoE."""
    h = cfg.hidden_size
    if not is_moe_layer(cfg, layer):
        return swiglu_shapes("", h, cfg.intermediate_size, cfg.mlp_bias)
    moe = cfg.moe
    out: Shapes = [("router", (moe.num_experts, h), "router")]
    if moe.router_bias:
        out.append(("router_bias", (moe.num_experts,), "bias"))
    for e in range(moe.num_experts):
        out += swiglu_shapes(f"experts.{e}.", h, moe.moe_intermediate_size, moe.expert_bias)
    if moe.has_shared:
        out += [(f"shared_{p}", shape, role)
                for p, (_, shape, role) in zip(_PROJ, swiglu_shapes("", h, moe.shared_intermediate_size))]
        if moe.shared_expert_gate:
            out.append(("shared_expert_gate", (1, h), "router"))
    return out


# checkpoint names (after `model.layers.{i}.`) of the MoE tensors, by layout
def _qwen_style(local: str, shared: str, router_bias: str) -> str | None:
    if local.startswith("experts."):
        return f"mlp.{local}.weight"
    if local.startswith("shared_") and local.endswith("_proj"):
        return f"mlp.{shared}.{local[len('shared_'):]}.weight"
    return {"router": "mlp.gate.weight", "router_bias": router_bias,
            "shared_expert_gate": "mlp.shared_expert_gate.weight"}.get(local)


def qwen_moe_name(local: str) -> str | None:
    """Qwen2/3-MoE, OLMoE: `mlp.gate`, `mlp.experts.{e}.*_proj`, `mlp.shared_expert[_gate]`."""
    return _qwen_style(local, "shared_expert", "mlp.gate.e_score_correction_bias")


def deepseek_moe_name(local: str) -> str | None:
    """DeepSeek-V2/V3, GLM-4.5: `mlp.gate` (+ `e_score_correction_bias`), `mlp.shared_experts`."""
    return _qwen_style(local, "shared_experts", "mlp.gate.e_score_correction_bias")


_MIXTRAL_PROJ = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}


def mixtral_moe_name(local: str) -> str | None:
    """Mixtral: `block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1/w2/w3` (gate, down, up)."""
    if local == "router":
        return "block_sparse_moe.gate.weight"
    if local.startswith("experts."):
        _, e, proj = local.split(".")
        return f"block_sparse_moe.experts.{e}.{_MIXTRAL_PROJ[proj]}.weight"
    return None
