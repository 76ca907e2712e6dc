"""Mixture-of-experts GGUF files under llama.cpp's names (torch-free): the config fields of
Mixtral (llama.cpp's "llama" with `expert_count`) and Qwen2-MoE ("qwen2moe"), and where each of
our MoE weights lies. llama.cpp stacks a layer's experts in one 3-D tensor per projection
(`ffn_gate_exps` (E, F, H) in numpy order, ...); each expert is one slab of it, read on its own,
so experts stay separate weights (and keep their quantized blocks)."""

from __future__ import annotations

from typing import Any

# our MoE local names -> llama.cpp's tensor (after `blk.{i}.`); expert projections are slabs
_EXPERT_TENSORS = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                   "down_proj": "ffn_down_exps.weight"}
_MOE_TENSORS = {"router": "ffn_gate_inp.weight", "router_bias": "exp_probs_b.bias",
                "shared_gate_proj": "ffn_gate_shexp.weight", "shared_up_proj": "ffn_up_shexp.weight",
                "shared_down_proj": "ffn_down_shexp.weight", "shared_expert_gate": "ffn_gate_inp_shexp.weight"}


def moe_gguf_tensor(local: str) -> tuple[str, int | None] | None:
    """(llama.cpp tensor name, expert slab or None) of a MoE weight; None for other weights."""
    if local.startswith("experts."):
        _, e, proj = local.split(".")
        return _EXPERT_TENSORS[proj], int(e)
    name = _MOE_TENSORS.get(local)
    return None if name is None else (name, None)


def moe_hf_fields(arch: str, f: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    """The HF config fields (model_type included) a MoE GGUF adds to `hf`, its LLaMA-like
    fields; {} for a dense file."""
    experts = f.get(f"{arch}.expert_count") or 0
    if not experts:
        return {}
    used = f[f"{arch}.expert_used_count"]
    if arch == "llama":  # Mixtral: experts as wide as the dense FFN would be, renormalized top-k
        return {"model_type": "mixtral", "num_local_experts": experts, "num_experts_per_tok": used}
    # qwen2moe: top-k never renormalized in llama.cpp's Qwen2-MoE graph; a gated shared expert
    return {"model_type": "qwen2_moe", "num_experts": experts, "num_experts_per_tok": used,
            "moe_intermediate_size": f[f"{arch}.expert_feed_forward_length"],
            "shared_expert_intermediate_size": f.get(f"{arch}.expert_shared_feed_forward_length", 0),
            "norm_topk_prob": False, "qkv_bias": hf.get("attention_bias", True),
            "intermediate_size": f.get(f"{arch}.feed_forward_length", f[f"{arch}.expert_feed_forward_length"])}
