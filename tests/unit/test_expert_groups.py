"""A MoE layer's routed experts streamed in groups: the engine's order of reads under a cap
(`ExpertGroups`), and the planner's prices for it (`placement.expert_groups`): the group's
bytes staged instead of every touched expert, each call's experts read anew over a sweep of
several calls, and a plan where staging every touched expert does not fit."""

import dataclasses

import pytest

import placement
from flexlamps.engine.executors.expert_groups import ExpertGroups
from tests.described import described
from placement.expert_groups import STREAMED, experts_read, staged_share


def _groups(size: int, holds=None):
    started, evicted = [], []
    return ExpertGroups(size, started.append, evicted.append, holds), started, evicted


def test_reads_start_as_the_group_has_room_and_room_is_made_from_finished_experts():
    groups, started, evicted = _groups(2)
    groups.want([1, 4, 6, 9], staged=set())
    assert started == [1, 4] and groups.queue == [6, 9]
    groups.finished(1)  # its room goes to the next read
    assert evicted == [1] and started == [1, 4, 6]
    groups.finished(4)
    groups.finished(6)
    assert evicted == [1, 4] and started == [1, 4, 6, 9] and not groups.queue
    groups.finished(9)  # nothing waits: finished experts stay staged (no pressure)
    assert evicted == [1, 4] and sorted(groups.held) == [6, 9]


def test_an_expert_routed_to_again_while_staged_is_kept_and_not_read_twice():
    groups, started, evicted = _groups(2)
    groups.want([3, 5], staged=set())
    groups.finished(3)
    groups.finished(5)
    groups.want([5, 7], staged={3, 5})  # the next micro-batch: 5 again, 7 new
    assert started == [3, 5, 7] and evicted == [3]  # 3 made room, 5 kept
    assert groups.held == [5, 7]


def test_without_a_cap_or_room_taken_nothing_is_given_back():
    groups, started, evicted = _groups(0)
    groups.want(list(range(10)), staged=set())
    for e in range(10):
        groups.finished(e)
    assert started == list(range(10)) and evicted == []
    # experts used where they live take no room: never counted, never evicted
    groups, started, evicted = _groups(1, holds=lambda e: e % 2 == 1)
    groups.want([0, 1, 2, 3, 4], staged=set())
    assert started == [0, 1, 2] and groups.queue == [3, 4]
    groups.finished(1)
    assert started == [0, 1, 2, 3, 4] and evicted == [1]


def test_the_forward_waiting_on_an_expert_gets_the_room_of_the_staged_one_it_needs_last():
    groups, started, evicted = _groups(2)
    groups.want([3, 9], staged=set())
    groups.finished(3)
    groups.finished(9)
    groups.want([1, 3, 9], staged={3, 9})  # 3 and 9 needed again, after 1: nothing finished to give back
    assert started == [3, 9] and groups.queue == [1]
    groups.pump(first=1)  # the forward asks for 1: 9 (needed last) makes room and waits its turn again
    assert evicted == [9] and started == [3, 9, 1] and groups.queue == [9]
    assert len(groups.held) <= 2
    groups.finished(1)
    groups.finished(3)
    assert started == [3, 9, 1, 9] and evicted == [9, 1] and len(groups.held) <= 2


# Qwen3-30B-A3B's layer: 128 experts of 3 x 2048 x 768 bf16, top-8
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, intermediate_size=6144,
                 num_experts=128, num_experts_per_tok=8, vocab_size=32768, torch_dtype="bfloat16")
ON_DISK = placement.TierSplit(gpu=0.0, cpu=0.0, disk=1.0)
ON_GPU = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
HW = placement.hardware_preset("rtx4090")
WORKLOAD = placement.WorkloadSpec(prompt_len=128, gen_len=8)


def _policy(**fields):
    return placement.Policy(**{**dict(gpu_batch_size=1, num_gpu_batches=1, weights=ON_DISK, cache=ON_GPU,
                                      activations=ON_GPU), **fields})


def test_a_group_stages_its_experts_and_a_streamed_sweep_of_several_calls_reads_each_calls_own():
    model = described(QWEN3_MOE)[1]
    assert staged_share(model, 128, 0) == 1.0 and staged_share(model, 128, STREAMED) == 2 / 128
    assert staged_share(model, 0.125, STREAMED) == staged_share(model, 0.125, 0) == 1 / 128
    # one call reads each touched expert once either way; four calls streamed read each call's own
    assert experts_read(model, STREAMED, 1, 512, 512) == experts_read(model, 0, 4, 128, 512) \
        == pytest.approx(model.expected_experts(512))
    assert experts_read(model, STREAMED, 4, 128, 512) == pytest.approx(4 * model.expected_experts(128))
    whole = placement.predict(_policy(num_gpu_batches=4), model, HW, WORKLOAD)
    streamed = placement.predict(_policy(num_gpu_batches=4, expert_group=STREAMED), model, HW, WORKLOAD)
    assert streamed.prefill_layer_s["dtoc"] > 1.5 * whole.prefill_layer_s["dtoc"]
    assert streamed.peak_bytes["gpu_prefill"] < whole.peak_bytes["gpu_prefill"]
    one = placement.predict(_policy(), model, HW, WORKLOAD)
    one_streamed = placement.predict(_policy(expert_group=STREAMED), model, HW, WORKLOAD)
    assert one_streamed.prefill_layer_s == one.prefill_layer_s and one_streamed.decode_s == one.decode_s


def test_the_planner_streams_experts_where_staging_every_touched_one_does_not_fit():
    """A gpu tier a tenth of one layer's experts: staging the 128 a prompt touches cannot fit,
    two at a time does; where the gpu tier holds the model, staging is moot and the tie goes to
    staging them together (every read started at once)."""
    model = described(QWEN3_MOE)[1]
    layer_experts = model.routed_expert_bytes_per_layer()
    tight = dataclasses.replace(HW, gpu_mem_bytes=int(layer_experts / 10), cpu_mem_bytes=1 << 30)
    plan = placement.solve(model, tight, WORKLOAD, allow_weight_compression=False, max_block_size=4)
    assert plan.policy.expert_group == STREAMED
    evaluated = placement.evaluate(dataclasses.replace(plan.policy, expert_group=0), model, tight, WORKLOAD)
    assert evaluated.peak_bytes["gpu"] > tight.gpu_mem_bytes
    roomy = dataclasses.replace(HW, gpu_mem_bytes=int(2 * model.total_weight_bytes()), cpu_mem_bytes=1 << 30)
    assert placement.solve(model, roomy, WORKLOAD, allow_weight_compression=False,
                           max_block_size=4).policy.expert_group == 0


# the MoE bench's small model (`scripts/bench_moe_checkpoint.py`): 8 layers of 32 experts, top-4
SMALL_MOE = dict(QWEN3_MOE, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, moe_intermediate_size=128, intermediate_size=512, num_experts=32,
                 num_experts_per_tok=4, vocab_size=4096)


def _disk_bytes_per_token(plan, model, hw) -> float:
    return plan.decode_layer_s["dtoc"] * hw.disk_read_bytes_per_s * model.num_layers / plan.policy.block_size


def test_a_job_of_many_prompts_shares_each_expert_read_among_as_many_sequences_as_memory_holds():
    """`generate` plans a job with its prompt count as the most sequences in flight: on a model
    mostly on disk the planner puts as many sequences in one sweep as the cpu tier holds caches
    for, and prices what that buys: a decode step's expert reads shared by the block, a quarter
    (or less) of the disk bytes a token of a block of 8 at the same placement. The caches kept in
    memory (`plan --no-cache-on-disk`); with them allowed on disk the block grows past what the cpu
    tier holds (`test_placement_moe_job.py`)."""
    model = described(SMALL_MOE)[1]
    hw = dataclasses.replace(HW, gpu_mem_bytes=8 << 20, cpu_mem_bytes=48 << 20)
    job = placement.WorkloadSpec(prompt_len=128, gen_len=64)
    in_memory = dataclasses.replace(placement.EngineCapabilities(), cache_on_disk=False)
    plan = placement.solve(model, hw, job, allow_weight_compression=False, allow_cache_compression=False,
                           max_block_size=1000, capabilities=in_memory)
    assert plan.policy.block_size >= 32 and plan.policy.weights.disk > 0.8 and plan.policy.cache.cpu == 1.0
    assert plan.peak_bytes["cpu"] > 0.8 * plan.budget_bytes["cpu"]  # the caches fill the memory
    eight = placement.evaluate(dataclasses.replace(plan.policy, gpu_batch_size=2, num_gpu_batches=4), model, hw, job)
    assert _disk_bytes_per_token(plan, model, hw) < _disk_bytes_per_token(eight, model, hw) / 3
    assert plan.tokens_per_s > 2 * eight.tokens_per_s
