"""Routed experts streamed through the gpu tier in groups (`Policy.expert_group`).

A layer whose tokens touch more experts than the gpu tier holds runs its experts a group at a
time: `group` of them staged at once (one computed while the next is read, as FlexGen
double-buffers layers), each given back when the next read needs its room. Memory: the group
instead of every expert the sweep's tokens pick. Time: a single call (a merged decode, one
prompt micro-batch) reads each touched expert once either way; a sweep of several calls (prompt
micro-batches, decode one micro-batch at a time) reads each call's touched experts anew once
they outnumber the group, where staging all of them reads each once a sweep.
"""

from __future__ import annotations

from placement.model_spec import ModelSpec

STREAMED = 2  # the planner's group when it streams: one expert computed while the next is read
ONE_AT_A_TIME = 1  # the last resort: room for a single expert (its read waits for the last one's compute)


def staged_share(model: ModelSpec, num_tokens: float, group: int) -> float:
    """The share of a layer's routed experts staged at once by calls over `num_tokens` tokens (as
    the memory rows charge them: every pick up to all experts, or the group)."""
    if not model.num_experts:
        return 0.0
    picks = num_tokens * model.num_experts_per_token
    if group:
        picks = min(picks, group)
    return min(1.0, picks / model.num_experts)


def experts_read(model: ModelSpec, group: int, calls: int, rows_per_call: float, sweep_tokens: float) -> float:
    """Expected routed experts a sweep reads per MoE layer: those its `sweep_tokens` tokens pick,
    once; or, streamed in a group smaller than them over several calls, each call's own
    (`rows_per_call` tokens) anew."""
    touched = model.expected_experts(sweep_tokens)
    if group and calls > 1 and group < touched:
        return calls * model.expected_experts(rows_per_call)
    return touched
