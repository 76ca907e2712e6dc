"""The augmented engine's two KV pools, sized from the tier budgets by the placement planner.

The augmented face runs the whole model on the `gpu` tier (weights, activations and the KV
blocks it attends over) and uses the `cpu` tier only as swap space for caches preserved out
of the way during API calls. Given the tiers' byte budgets, the planner's memory model
(`placement.evaluate` of that all-gpu policy, one micro-batch of `max_num_seqs` sequences of
`max_context` tokens) gives each tier's peak and budget; each pool gets what its tier's budget
leaves once everything but the KV cache is in:

    gpu KV pool   = gpu budget - (gpu peak - the planned KV cache)
    cpu swap pool = cpu budget - cpu peak          (nothing else lives there)

So the scheduler's capacities (BlockManager gpu / cpu blocks) follow the budgets the planner
enforces for every other run. Pure placement arithmetic: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from placement import (HardwareSpec, ModelSpec, Plan, Policy, TierSplit, WorkloadSpec, evaluate, format_bytes,
                       hardware_preset)

ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVPools:
    gpu_kv_bytes: int  # KV blocks on the gpu tier
    cpu_swap_bytes: int  # swap space on the cpu tier
    plan: Plan  # the planner's view of the all-gpu run (peaks and budgets per tier)


def engine_workload(max_context: int, max_num_seqs: int, max_num_batched_tokens: int) -> WorkloadSpec:
    """The augmented engine as a planner workload: prompts are prefilled in chunks of the
    iteration's token budget shared by the batch, contexts grow to `max_context`."""
    if max_context < 2:
        raise ValueError(f"max_context must be >= 2 tokens, got {max_context}")
    prompt = max(1, min(max_context - 1, max_num_batched_tokens // max(1, max_num_seqs)))
    return WorkloadSpec(prompt_len=prompt, gen_len=max_context - prompt)


def kv_pools(model: ModelSpec, *, gpu_mem_bytes: int, cpu_mem_bytes: int, max_num_seqs: int,
             max_context: int, max_num_batched_tokens: int, usable_fraction: float = 0.9,
             hardware: HardwareSpec | None = None) -> KVPools:
    """The gpu KV pool and cpu swap pool for the tier budgets `gpu_mem_bytes` / `cpu_mem_bytes`.

    Args:
        model: the served model, in the dtype the engine runs it in.
        max_num_seqs, max_context, max_num_batched_tokens: the engine's batch limits.
        usable_fraction: share of each budget the planner lets a run fill (its default).
        hardware: the machine, for the plan's times only (the pools depend on the budgets
            alone); a preset when None.

    Raises:
        ValueError: the weights and working set alone overflow the gpu budget.
    """
    hardware = (hardware or hardware_preset("rtx3090")).with_memory(
        gpu_mem_bytes=gpu_mem_bytes, cpu_mem_bytes=max(1, cpu_mem_bytes))
    policy = Policy(gpu_batch_size=max_num_seqs, num_gpu_batches=1, weights=ON_GPU, cache=ON_GPU,
                    activations=ON_GPU)
    workload = engine_workload(max_context, max_num_seqs, max_num_batched_tokens)
    plan = evaluate(policy, model, hardware, workload, usable_fraction=usable_fraction)
    # the KV cache the plan holds for the micro-batch, as placement.cost sizes it
    planned_cache = (model.num_layers * max_num_seqs * (workload.prompt_len + workload.gen_len)
                     * model.cache_bytes_per_token_per_layer())
    gpu = plan.budget_bytes["gpu"] - (plan.peak_bytes["gpu"] - planned_cache)
    cpu = plan.budget_bytes["cpu"] - plan.peak_bytes["cpu"] if cpu_mem_bytes > 0 else 0
    if gpu <= 0:
        raise ValueError(f"gpu budget of {format_bytes(gpu_mem_bytes)} leaves no room for KV blocks: "
                         f"the weights and working set need {format_bytes(-gpu)} more than its "
                         f"{usable_fraction:.0%} usable share; raise the gpu budget or lower max_num_seqs")
    return KVPools(gpu_kv_bytes=int(gpu), cpu_swap_bytes=max(0, int(cpu)), plan=plan)
