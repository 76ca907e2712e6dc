"""The augmented face's two KV pools on an offload executor, sized from the tiers' budgets.

The placement planner places the weights across gpu / cpu / disk for the agents workload
(`planner_budgets` keeps part of each tier out of its reach for the pools); the executor then
charges what it placed. What each tier has left, less the working set of the largest
iteration the scheduler can issue (measured by running that iteration once, `working_set`),
becomes the pool: KV blocks on the gpu tier, where attention runs, and swap space on the cpu
tier, where paused requests' blocks go. Both pools are charged to the same budgets, so a run
never holds more than `--gpu-mem` / `--cpu-mem` on either tier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flexlamps.engine.caches.paged_state import paged_state_blocks, probing
from flexlamps.engine.caches.window import paged_ring_blocks
from flexlamps.engine.executors.contract import Executor
from flexlamps.engine.executors.step import Step, prompt_step
from placement import format_bytes

# the share of a measured working set added on top, for iterations whose shape the probe did not
# hit exactly (spans between blocks, a merge refused); a run over it fails loudly, never silently
WORKING_SET_MARGIN = 0.10


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSizes:
    gpu_kv_bytes: int  # KV blocks on the gpu tier
    cpu_swap_bytes: int  # swap space on the cpu tier
    gpu_working_set: int  # measured peak of the largest iteration beyond the resting bytes
    cpu_working_set: int


def agents_workload(max_context: int, max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, int]:
    """(prompt_len, gen_len) of the augmented engine as a planner workload: prompts are
    prefilled in chunks of the iteration's token budget shared by the batch, contexts grow to
    `max_context`."""
    if max_context < 2:
        raise ValueError(f"max_context must be >= 2 tokens, got {max_context}")
    prompt = max(1, min(max_context - 1, max_num_batched_tokens // max(1, max_num_seqs)))
    return prompt, max_context - prompt


def planner_budgets(gpu_mem: int, cpu_mem: int, kv_bytes_per_token: int, max_num_seqs: int,
                    max_context: int, state_bytes: int = 0) -> tuple[int, int]:
    """The gpu and cpu budgets the planner may fill with weights and its working set: what is
    left after keeping room for every running request's full context (a quarter of the gpu
    tier at most) and as much swap space (a quarter of the cpu tier at most)."""
    want = max_num_seqs * (max_context * kv_bytes_per_token + state_bytes)  # a hybrid model's state per request
    return gpu_mem - min(gpu_mem // 4, want), cpu_mem - min(cpu_mem // 4, want)


def _probe_iterations(max_context: int, max_num_seqs: int, max_num_batched_tokens: int) -> list[list[Step]]:
    """The largest iterations the scheduler can issue, all at the last position: one prompt
    chunk of the whole token budget; every other running request decoding beside the chunk the
    rest of the budget allows; and every request with one prompt token to feed, a two-column
    prompt step (rows index the probe's block tables)."""
    def chunk(tokens: int, row: int) -> Step:
        return Step(torch.zeros((1, tokens), dtype=torch.long),
                    torch.arange(max_context - tokens, max_context)[None], torch.tensor([row]),
                    torch.tensor([tokens - 1]))

    whole = max(1, min(max_num_batched_tokens, max_context))
    decodes = max(0, min(max_num_seqs - 1, max_num_batched_tokens // 2))
    mixed = [Step(torch.zeros((decodes, 1), dtype=torch.long), torch.full((decodes, 1), max_context - 1),
                  torch.arange(decodes), torch.zeros(decodes, dtype=torch.long))] if decodes else []
    rest = min(max_context, max_num_batched_tokens - decodes)
    singles = max(1, min(max_num_seqs, max_num_batched_tokens))
    padded = prompt_step([[0]] * singles, [max(0, max_context - 2)] * singles, torch.arange(singles))
    return [[chunk(whole, 0)], mixed + ([chunk(rest, decodes)] if rest > 0 else []), [padded]]


def working_set(executor: Executor, *, max_context: int, max_num_seqs: int, max_num_batched_tokens: int,
                block_size: int) -> dict[str, int]:
    """Peak bytes per tier above the resting use while the largest iteration runs. Its rows
    all point at one scratch block (the values do not matter, the shapes do)."""
    cache = executor.new_paged_cache(1, 0, block_size)
    try:
        width = -(-max_context // block_size) + getattr(cache, "state_blocks", 0)
        slots = cache.set_block_tables([[0] * width] * max(1, max_num_seqs))
        resting = {tier: use.used_bytes for tier, use in executor.tier_use().items()}
        executor.reset_peaks()
        probes = _probe_iterations(max_context, max_num_seqs, max_num_batched_tokens)
        for steps in probes:
            with probing(cache):  # every row shares the scratch block: shapes only
                executor.forward_steps(cache, [_on(s, cache.device, slots) for s in steps])
        ws = {tier: use.peak_bytes - resting[tier] for tier, use in executor.tier_use().items()}
    finally:
        cache.release()
    # the measured peak depends on whether the next layer's prefetch overlapped this one's
    # staging (I/O-thread timing); the charges' worst case keeps the pools the same every run
    worst = max(executor.planned_sweep_gpu_bytes([(*s.input_ids.shape, int(s.positions.max()) + 1) for s in steps])
                for steps in probes)
    ws["gpu"] = max(ws["gpu"], worst)
    return ws


def _on(step: Step, device, slots: torch.Tensor) -> Step:
    """A probe's step on the cache's device, its rows the probe's block tables' `slots`."""
    lengths = None if step.lengths is None else step.lengths.to(device)
    return Step(step.input_ids.to(device), step.positions.to(device), slots[step.slots.to(slots.device)],
                step.logit_rows.to(device), lengths=lengths)


def pool_sizes(executor: Executor, *, max_context: int, max_num_seqs: int, max_num_batched_tokens: int,
               block_size: int, swap: bool = True) -> PoolSizes:
    """What each tier's budget leaves for its pool once the weights are placed and the largest
    iteration's working set (plus a margin) is kept free. `swap=False`: no swap pool.

    Raises:
        ValueError: the gpu pool cannot hold one request of `max_context` tokens.
    """
    ws = working_set(executor, max_context=max_context, max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=max_num_batched_tokens, block_size=block_size)
    use = executor.tier_use()
    left = {tier: u.capacity_bytes - u.used_bytes - int(ws[tier] * (1 + WORKING_SET_MARGIN))
            for tier, u in use.items()}
    kv_blocks = -(-max_context // block_size)
    ring = paged_ring_blocks(executor.cfg, block_size)  # every layer slides: a request keeps a ring of blocks
    blocks = min(kv_blocks, ring or kv_blocks) + paged_state_blocks(executor.cfg, block_size, executor.dtype)
    need = blocks * block_size * executor.cfg.kv_bytes_per_token(executor.dtype.itemsize)
    if left["gpu"] < need:
        raise ValueError(f"the gpu budget leaves {format_bytes(max(0, left['gpu']))} for KV blocks once the "
                         f"weights ({format_bytes(use['gpu'].used_bytes)} resident) and the working set "
                         f"({format_bytes(ws['gpu'])}) are in, but one request of {max_context} tokens needs "
                         f"{format_bytes(need)}; raise --gpu-mem or lower --max-context / --max-num-seqs")
    return PoolSizes(gpu_kv_bytes=left["gpu"], cpu_swap_bytes=max(0, left["cpu"]) if swap else 0,
                     gpu_working_set=ws["gpu"], cpu_working_set=ws["cpu"])
