"""A plan's decode terms with the expert cache's hits (`Choice.expert_hits`), and with the disk
holding routed experts only where the engine's placement leaves nothing else there
(`Choice.disk_experts_only`).

The engine keeps the experts it reads off the disk tier (beside a GPU, the copies off the cpu tier
too) in whatever the gpu tier's budget leaves free; how many of a step's reads that saves depends
on the room and on how a sequence's routing repeats from step to step. With routing traced on
the user's prompts (`flexlamps profile --model M --prompts FILE`), the share is the engine's own
eviction rule replayed over the traces (`placement.expert_hits`) with the room the plan leaves:
the tier's bytes less what its decode row holds besides routed experts. Without traces it is 0
(every routed read priced: an upper bound on the reads). The LP chooses fractions without either
(the room is a product of the fractions, the disk's content a piecewise function of them), so
this prices the plan chosen, and any given policy, at its fractions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from placement.affine import W_CPU, W_DISK
from placement.choice import Choice, CostTerms
from placement.layer_sizes import layer_sizes
from placement.terms import build_terms
from placement.expert_compute import tokens_per_expert
from placement.expert_hits import expert_hit_rate, held_out_kinds
from placement.model_spec import ModelSpec
from placement.specs import HardwareSpec, WorkloadSpec


def with_expert_hits(choice: Choice, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec,
                     x: np.ndarray, terms: CostTerms | None = None) -> CostTerms:
    """`build_terms` for `choice` (`terms`: those already built, without hits), its decode priced
    with the hits the expert cache has at fractions `x`."""
    terms = terms if terms is not None else build_terms(choice, model, hardware, workload)
    if not model.num_experts:
        return terms
    choice = dataclasses.replace(choice, cpu_expert_tokens=terms.cpu_expert_tokens,
                                 disk_experts_only=_disk_holds_experts_only(choice, model, workload, x))
    routing = model.routing
    if routing is not None and routing.traces:
        choice = dataclasses.replace(choice, expert_hits=expert_hits_at(choice, model, hardware, workload, x, terms))
    if not (choice.expert_hits or choice.disk_experts_only):
        return terms
    return build_terms(choice, model, hardware, workload)


def _disk_holds_experts_only(choice: Choice, model: ModelSpec, workload: WorkloadSpec, x: np.ndarray) -> bool:
    """Whether the engine's placement leaves only routed experts on disk at fractions `x`: every
    layer a MoE layer, and the disk share no more than the experts' (a layer's dense parts and the
    head go to the faster tiers first, `flexlamps.engine.executors.placement_map`)."""
    if model.num_dense_layers or not x[W_DISK]:
        return False
    sz = layer_sizes(choice, model, workload)
    return float(x[W_DISK]) * sz.weight_stored <= sz.experts_stored


def expert_hits_at(choice: Choice, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec,
                   x: np.ndarray, terms: CostTerms) -> float:
    """The share of cached-kind expert reads the cache serves at fractions `x` (see the module)."""
    sz = layer_sizes(choice, model, workload)
    moe_layers = sorted({int(j) for steps in model.routing.traces for step in steps for j in step})
    num_experts = model.num_experts
    expert_bytes = expert_stored_bytes(choice, model, workload)
    block = choice.gpu_batch_size * choice.num_gpu_batches
    _, rows = choice.decode_calls()
    layer_room, between_steps = cache_room(terms, hardware, x)
    copies_off_cpu = not hardware.gpu_is_host and tokens_per_expert(model, rows) >= choice.cpu_expert_tokens
    off = float(x[W_DISK]) + (float(x[W_CPU]) if copies_off_cpu else 0.0)
    # a layer's bytes: its dense parts first on the fastest tiers, then its experts hottest first
    layer = sz.layer_stored - sz.experts_stored + num_experts * expert_bytes
    slow = _experts_on(off * layer, expert_bytes, num_experts)
    kinds = held_out_kinds(model.routing, moe_layers, lambda _: slow)
    return expert_hit_rate(model.routing, block, int(layer_room // expert_bytes), kinds, model.num_layers,
                           between_steps=int(between_steps // expert_bytes))


def expert_stored_bytes(choice: Choice, model: ModelSpec, workload: WorkloadSpec) -> float:
    """One routed expert's bytes as stored: what a slot of the expert cache holds."""
    sz = layer_sizes(choice, model, workload)
    moe_layers = max(1, model.num_layers - model.num_dense_layers)
    return sz.experts_stored * model.num_layers / (moe_layers * model.num_experts)


def cache_room(terms: CostTerms, hardware: HardwareSpec, x: np.ndarray) -> tuple[float, float]:
    """Bytes of the gpu tier's budget the expert cache has at fractions `x`: while a layer runs (the
    decode row's other bytes taken; its staged routed experts count in the room, the replay stages
    them there) and between steps (the output head's row taken: its staged rows reclaim the rest)."""
    routed = terms.staging.capped_at("gpu_decode", x) if terms.staging is not None else 0.0
    layer = hardware.gpu_mem_bytes - (terms.memory_value("gpu_decode", x) - routed)
    return max(0.0, layer), max(0.0, hardware.gpu_mem_bytes - terms.memory_value("gpu_head", x))


def _experts_on(tier_bytes: float, expert_bytes: float, num_experts: int) -> int:
    """Whole experts in `tier_bytes` of a layer's slowest tiers (its coldest, placed last)."""
    return int(min(num_experts, max(0.0, round(tier_bytes / expert_bytes))))
