"""A dry run of the offload executor: what it charges each tier for one block of a policy,
without loading weights or allocating anything.

It places every weight with the executor's own `WeightStore`, on paper (tables cut by vocab rows, each
weight sized in the form the executor stores, on torch's meta device; `charges.PlacementCharges` charges
its sweeps), sizes the KV cache with the tiered cache's own buffers (meta again) and an MLA latent cache with the latent cache's own
record formats and pools (`latent_cache_bytes`), then charges one prefill sweep and the last, longest
decode sweep as the executor does, merging the decode micro-batches when the executor would.
A plan the executor would refuse raises the same `BudgetExceededError`.
`tests/property/test_plan_engine_agreement.py` holds it to the executor's measured peaks on a tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass

import placement
from flexlamps.engine.caches.hybrid import kv_view
from flexlamps.engine.caches.latent import latent_cache_bytes
from flexlamps.engine.caches.state import state_layer_bytes
from flexlamps.engine.caches.tiered import layer_bytes
from flexlamps.engine.caches.window import layer_rings
from flexlamps.engine.executors.charges import PlacementCharges, kv_quant_config, with_backend
from flexlamps.engine.executors.stored_weights import int4_weights, weight_bits
from flexlamps.engine.executors.offloaded import unsupported
from flexlamps.planning.target import BlockLengths, PlanTarget
from offload import TierBudget
from placement.specs import prompt_columns


@dataclass(frozen=True, slots=True)
class DryRun:
    """Peak bytes the executor charged per tier (disk: what the offload folder holds)."""

    peak_bytes: dict[str, int]
    merged_decode: bool  # the decode sweep ran its micro-batches merged


def dry_run(target: PlanTarget, policy: placement.Policy, lengths: BlockLengths, *, gpu_mem: int, cpu_mem: int,
            latent_fp8: bool = False, fused_int4: bool | None = None) -> DryRun:
    """Charge the budgets as `OffloadExecutor` would for one block of `policy`: its
    `gpu_batch_size * num_gpu_batches` prompts of `lengths.prompt_len` tokens generating
    `lengths.gen_len`, a shared prefix in a one-row cache of its own for the whole run (generate's),
    prompt rows returning `lengths.logits_per_row` positions' logits; `latent_fp8` as the
    executor's (an MLA latent cache in ESS's FP8 records); `fused_int4`: whether the target
    multiplies 4-bit weights in place (`PlacementCharges`).

    Raises:
        ValueError: the executor would not run the policy as planned (see CAPABILITIES).
        BudgetExceededError: a charge does not fit its tier, as in a real run.
    """
    config, weight_quant = target.config, target.weight_quant
    if problems := unsupported(policy, config):
        raise ValueError(f"the offload engine cannot run this policy as planned ({'; '.join(problems)})")
    policy = with_backend(policy, weight_quant)
    run = PlacementCharges.on_paper(config, policy, target.dtype, latent_fp8=latent_fp8, fused_int4=fused_int4,
                                    routing=target.routing, model_spec=target.model, in_place=target.in_place,
                                    int4=int4_weights(policy, weight_quant), weight_bits=weight_bits(policy, weight_quant))
    budgets = {"gpu": TierBudget("gpu", gpu_mem), "cpu": TierBudget("cpu", cpu_mem)}
    for name, tier in run.store.tiers.items():  # each weight, each piece of a split table
        if tier != "disk":
            budgets[tier].allocate(run.store.stored[name], f"{name} resident")
    num_slots = policy.gpu_batch_size * policy.num_gpu_batches
    prompt_len, gen_len = lengths.prompt_len, lengths.gen_len
    disk = _charge_cache(run, budgets, num_slots, prompt_len + gen_len)
    if lengths.prefix_len:
        disk += _charge_cache(run, budgets, 1, lengths.prefix_len)
    columns = prompt_columns(prompt_len)  # a one-token prompt runs in two columns
    _sweep(run, budgets, [(policy.gpu_batch_size, columns, columns)] * policy.num_gpu_batches,
           lengths.logits_per_row)
    span = prompt_len + gen_len - 1  # the last decode step attends to the longest context
    merged = (policy.merge_decode and policy.num_gpu_batches > 1
              and run.sweep_gpu_peak([(num_slots, 1, span)]) <= budgets["gpu"].free_bytes)
    rows = [num_slots] if merged else [policy.gpu_batch_size] * policy.num_gpu_batches
    _sweep(run, budgets, [(n, 1, span) for n in rows])
    disk += sum(run.store.stored[name] for name, tier in run.store.tiers.items() if tier == "disk")
    return DryRun({"gpu": budgets["gpu"].peak_bytes, "cpu": budgets["cpu"].peak_bytes, "disk": disk}, merged)


def _charge_cache(run: PlacementCharges, budgets: dict[str, TierBudget], num_slots: int, capacity: int) -> int:
    """The cache the executor's `new_cache` builds: an MLA latent cache (whole on the gpu tier,
    or ESS's cpu records and gpu pools) or a KV cache, layer by layer on the policy's tiers (a
    sliding-window layer's ring: its window, not the capacity). Returns its bytes on disk."""
    policy, dtype = run.policy, run.dtype
    if run.cfg.mla is not None:
        latent = latent_cache_bytes(run.cfg, num_slots, capacity, dtype, gpu_fraction=policy.cache.gpu,
                                    layer_fractions=policy.latent_pools, fp8=run.latent_fp8)
        for tier, nbytes in latent.items():
            budgets[tier].allocate(nbytes, f"latent cache ({tier})")
        return 0
    compress = kv_quant_config(policy) if policy.compress_cache else None
    cfg = run.cfg
    if cfg.hybrid is not None:  # KV in the full-attention layers, a fixed state in the DeltaNet ones
        state_bytes = state_layer_bytes(cfg.hybrid, num_slots, dtype)
        cfg = kv_view(cfg)
    rings = iter(layer_rings(cfg, capacity, compressed=compress is not None))
    disk = 0
    for layer, tier in enumerate(run.cache_tiers):
        linear = run.cfg.hybrid is not None and run.cfg.hybrid.is_linear(layer)
        nbytes = state_bytes if linear else layer_bytes(cfg, num_slots, next(rings) or capacity, dtype, compress)
        if tier == "disk":  # a disk-tier layer's files, paged by the OS (`caches.disk_rows`)
            disk += nbytes
        else:
            budgets[tier].allocate(nbytes, f"cache layer {layer} ({tier})")
    return disk


def _sweep(run: PlacementCharges, budgets: dict[str, TierBudget], steps, logits_per_row: int = 1) -> None:
    """Charge one sweep's peak: activations on the cpu tier when they live there, the rest on
    the gpu tier (see `PlacementCharges.sweep_gpu_peak`)."""
    host = run.activation_bytes(steps) if run.activation_tier == "cpu" else 0
    budgets["cpu"].allocate(host, "activations (cpu)")
    try:
        peak = run.sweep_gpu_peak(steps, room=budgets["gpu"].free_bytes, logits_per_row=logits_per_row)
        budgets["gpu"].allocate(peak, "one sweep")
        budgets["gpu"].free(peak)
    finally:
        budgets["cpu"].free(host)
