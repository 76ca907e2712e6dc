"""The planner keeps room in the gpu tier for the expert cache where the hits it buys are worth
more than resident weights (`placement.search._with_cache_room`): the LP alone gives every byte
it can to resident weights, because the cache's hits are a replay of traced routing it cannot
price."""

import dataclasses
import random

import pytest

import placement
from placement import search
from placement.routing import RoutingProfile
from tests.described import described

# a Qwen3-MoE shape: 4 layers of 16 experts of 3 x 512 x 256 bf16 (768 KiB each), top-2
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=64, intermediate_size=1024, moe_intermediate_size=256,
                 num_experts=16, num_experts_per_tok=2, vocab_size=4096, torch_dtype="bfloat16")
WORKLOAD = placement.WorkloadSpec(prompt_len=16, gen_len=12)
# a 16 MiB gpu tier, 8 MiB cpu tier, the rest (most of the 53 MiB of weights) on a slow disk
HARDWARE = dataclasses.replace(placement.hardware_preset("rtx4090"), gpu_mem_bytes=16 << 20,
                               cpu_mem_bytes=8 << 20, disk_bytes=1 << 34, disk_read_bytes_per_s=0.5e9)


def _model(traced: bool):
    """Six traced sequences, each routing every step to its own pair of experts a layer."""
    rng = random.Random(0)
    traces = [[{str(j): rng.sample(range(16), 2) for j in range(4)}] * 12 for _ in range(6)]
    routing = RoutingProfile(16, 2, traces=traces) if traced else None
    return dataclasses.replace(described(QWEN3_MOE)[1], routing=routing)


def _plans(model, monkeypatch):
    """(the plan, the LP's own plan priced with its hits)."""
    plan = placement.solve(model, HARDWARE, WORKLOAD, max_block_size=1, allow_weight_compression=False)
    monkeypatch.setattr(search, "_with_cache_room", lambda best, *args: (best, 0))
    return plan, placement.solve(model, HARDWARE, WORKLOAD, max_block_size=1, allow_weight_compression=False)


def test_sequences_that_keep_their_experts_get_room_to_cache_them(monkeypatch):
    plan, lp_only = _plans(_model(traced=True), monkeypatch)
    assert plan.policy.weights.gpu < lp_only.policy.weights.gpu - 0.05  # resident bytes given up
    assert plan.tokens_per_s > 1.5 * lp_only.tokens_per_s  # priced with the hits the room buys
    assert all(plan.peak_bytes[t] <= plan.budget_bytes[t] * (1 + 1e-9) for t in ("gpu", "cpu", "disk"))
    again = placement.evaluate(plan.policy, _model(traced=True), HARDWARE, WORKLOAD)
    assert again.tokens_per_s == pytest.approx(plan.tokens_per_s, rel=1e-6)  # the policy prices as planned


def test_without_traced_routing_no_hits_are_priced_and_the_lp_plan_stands(monkeypatch):
    plan, lp_only = _plans(_model(traced=False), monkeypatch)
    assert plan.policy == lp_only.policy and plan.tokens_per_s == lp_only.tokens_per_s
