"""A MoE job of many prompts: the planner puts as many sequences in one sweep as the memory for
their caches allows, the caches on disk where the memory tiers are short, so each expert read
serves more tokens (FlexGen's trade, priced by its disk terms)."""

import placement
from placement.search import FIT_OVERSHOOT, block_grid
from tests.described import described

# Qwen3-30B-A3B's MoE layer (128 experts of width 768, top-8) in 4 layers, bf16: 4.9 GiB
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, intermediate_size=6144,
                 num_experts=128, num_experts_per_tok=8, vocab_size=32768, norm_topk_prob=True,
                 torch_dtype="bfloat16")


def test_a_job_short_of_memory_keeps_its_caches_on_disk_for_a_larger_sweep():
    """Each memory tier 5% of the model, 1000 prompts: with the cache allowed on disk the plan
    shares a sweep between more sequences, keeps most of their cache on disk, and predicts more
    tokens a second than the best plan that keeps the cache in memory."""
    model = described(QWEN3_MOE)[1]
    weights = model.total_weight_bytes()
    hw = placement.hardware_preset("rtx4090").with_memory(gpu_mem_bytes=weights // 20, cpu_mem_bytes=weights // 20,
                                                          disk_bytes=100 << 30)
    workload = placement.WorkloadSpec(prompt_len=128, gen_len=64)

    def plan(**capabilities):
        return placement.solve(model, hw, workload, max_block_size=1000, allow_weight_compression=False,
                               allow_cache_compression=False,
                               capabilities=placement.EngineCapabilities(**capabilities))

    on_disk, in_memory = plan(), plan(cache_on_disk=False)
    assert on_disk.policy.cache.disk >= 0.5 and in_memory.policy.cache.disk == 0
    assert on_disk.policy.block_size > in_memory.policy.block_size
    assert on_disk.tokens_per_s > 1.2 * in_memory.tokens_per_s
    assert on_disk.peak_bytes["disk"] > in_memory.peak_bytes["disk"]  # the caches' files


def test_a_job_that_memory_lets_share_one_sweep_is_planned_as_one_block_of_all_its_prompts():
    """1000 prompts, each memory tier a quarter of the model: the grid's largest block under 1000 is 768
    (768 + 232: a decode step's expert reads paid by two sweeps); the plan holds all 1000 in one block of
    equal micro-batches (within `FIT_OVERSHOOT` of 1000), and prices more tokens a second than at 768."""
    model = described(QWEN3_MOE)[1]
    weights = model.total_weight_bytes()
    hw = placement.hardware_preset("rtx4090").with_memory(gpu_mem_bytes=weights // 4, cpu_mem_bytes=weights // 4,
                                                          disk_bytes=100 << 30)
    workload = placement.WorkloadSpec(prompt_len=128, gen_len=64)

    def plan(most):
        return placement.solve(model, hw, workload, max_block_size=most, allow_weight_compression=False,
                               allow_cache_compression=False)

    job, grid = plan(1000), plan(768)
    assert 1000 <= job.policy.block_size <= 1000 * (1 + FIT_OVERSHOOT)
    assert job.tokens_per_s > grid.tokens_per_s


def test_the_block_grid_adds_splits_of_the_whole_job_and_no_block_far_past_it():
    assert (125, 8) in block_grid(1000) and (63, 16) in block_grid(1000)  # 1008: 0.8% over
    assert (16, 64) not in block_grid(1000)  # 1024: 2.4% over
    assert all(gbs * ngb <= 8 for gbs, ngb in block_grid(8))  # (3, 3) would price 9 sequences for 8
