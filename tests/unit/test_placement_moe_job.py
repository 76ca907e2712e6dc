"""A MoE job of many prompts: the planner puts as many sequences in one sweep as the memory for
their caches allows, the caches on disk where the memory tiers are short, so each expert read
serves more tokens (FlexGen's trade, priced by its disk terms)."""

import placement
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
