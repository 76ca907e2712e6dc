"""How many sequences a plan's placement holds for a hybrid (gated-DeltaNet) model, beside the
same model with every layer full attention: the number the fixed-size state buys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from placement.model_spec import ModelSpec
from placement.search import evaluate
from placement.specs import HardwareSpec, Policy, WorkloadSpec

_MAX_BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class SequenceFit:
    sequences: int  # the largest block the placement holds within every tier's budget (0: none)
    cache_bytes_per_sequence: float  # KV at the full context plus the fixed states


def all_full_attention(model: ModelSpec) -> ModelSpec:
    """`model` with its DeltaNet layers replaced by full attention (its KV in every layer)."""
    return dataclasses.replace(model, num_linear_layers=0, name=f"{model.name} (all full attention)")


def sequences_that_fit(policy: Policy, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec,
                       usable_fraction: float = 0.9) -> SequenceFit:
    """With `policy`'s tier fractions and micro-batch size, the most sequences (gpu batch x
    micro-batches) whose peaks stay within the budgets, by bisection on the micro-batch count."""
    context = workload.prompt_len + workload.gen_len
    per_seq = model.num_layers * (model.cache_bytes_per_token_per_layer() * context
                                  + model.state_bytes_per_sequence_per_layer())

    def fits(batches: int) -> bool:
        plan = evaluate(dataclasses.replace(policy, num_gpu_batches=batches), model, hardware, workload,
                        usable_fraction=usable_fraction)
        return all(plan.peak_bytes[t] <= plan.budget_bytes[t] * (1 + 1e-6) for t in plan.peak_bytes)  # LP rounding

    if not fits(1):
        return SequenceFit(0, per_seq)
    lo, hi = 1, 2
    while hi * policy.gpu_batch_size < _MAX_BLOCK and fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return SequenceFit(lo * policy.gpu_batch_size, per_seq)
