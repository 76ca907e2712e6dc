"""The cost model against FlexGen's published numbers, and each extension's direction."""

import dataclasses

import pytest

from placement import (HardwareSpec, Policy, TierSplit, WorkloadSpec, hardware_preset,
                       model_preset, predict, solve)

T4 = hardware_preset("t4-flexgen")
FLEXGEN_WORKLOAD = WorkloadSpec(prompt_len=512, gen_len=32)
ON_CPU = TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
# FlexGen's OPT-30B run on the T4 box (paper Table 2 / bench suite): block 48 x 3,
# weights 20% GPU 80% CPU, cache and activations on CPU, attention on CPU: 7.32 tok/s. FlexGen's
# engine decodes the micro-batches one by one.
FLEXGEN_OPT30B = Policy(gpu_batch_size=48, num_gpu_batches=3,
                        weights=TierSplit(gpu=0.2, cpu=0.8, disk=0.0), cache=ON_CPU,
                        activations=ON_CPU, cpu_attention=True, merge_decode=False)
FLEXGEN_OPT30B_TOK_S = 7.32


def test_flexgen_opt30b_policy_within_15_percent():
    result = predict(FLEXGEN_OPT30B, model_preset("opt-30b"), T4, FLEXGEN_WORKLOAD)
    assert result.tokens_per_s == pytest.approx(FLEXGEN_OPT30B_TOK_S, rel=0.15)
    assert result.total_s == pytest.approx(result.prefill_s + result.decode_s)
    # decode is bound by CPU attention, as FlexGen reports
    assert result.decode_layer_s["comp"] > result.decode_layer_s["ctog"]


def test_solved_opt30b_within_15_percent_of_flexgen():
    plan = solve(model_preset("opt-30b"), T4, FLEXGEN_WORKLOAD, allow_weight_compression=False,
                 allow_cache_compression=False, allow_merged_decode=False)
    assert plan.tokens_per_s == pytest.approx(FLEXGEN_OPT30B_TOK_S, rel=0.15)


def test_compressed_opt175b_is_feasible_and_needs_compression_to_stay_off_disk():
    plan = solve(model_preset("opt-175b"), T4, FLEXGEN_WORKLOAD)
    assert plan.policy.compress_weight
    assert plan.tokens_per_s > 0
    for tier in ("gpu", "cpu", "disk"):
        assert plan.peak_bytes[tier] <= plan.budget_bytes[tier] * (1 + 1e-6)
    uncompressed = solve(model_preset("opt-175b"), T4, FLEXGEN_WORKLOAD,
                         allow_weight_compression=False, allow_cache_compression=False)
    assert uncompressed.policy.weights.disk > 0  # 350 GB of fp16 weights cannot fit in 224 GB
    assert plan.tokens_per_s > uncompressed.tokens_per_s


def _split(gpu_percent: int, cpu_percent: int) -> TierSplit:
    return TierSplit(gpu=gpu_percent / 100, cpu=cpu_percent / 100,
                     disk=(100 - gpu_percent - cpu_percent) / 100)


# FlexGen's published T4 runs (benchmark suite policies, prompt 512, output 32) with the
# tolerance this model meets. Its uncompressed OPT-175B run (0.69 tok/s) is left out: it
# keeps the whole cache on disk, which no disk-bandwidth model reproduces (FlexGen's own
# model predicts 0.15); its benchmark extrapolated it from a few batches.
FLEXGEN_RUNS = [
    ("opt-6.7b", Policy(gpu_batch_size=2, num_gpu_batches=1, weights=ON_GPU, cache=ON_GPU,
                        activations=ON_GPU), 25.26, 0.15),
    ("opt-6.7b", Policy(gpu_batch_size=72, num_gpu_batches=1, weights=ON_GPU, cache=ON_GPU,
                        activations=ON_GPU, compress_weight=True, compress_cache=True),
     29.12, 0.25),
    ("opt-30b", Policy(gpu_batch_size=64, num_gpu_batches=8, weights=ON_CPU, cache=ON_CPU,
                       activations=ON_CPU, compress_cache=True), 8.38, 0.15),
    ("opt-175b", Policy(gpu_batch_size=48, num_gpu_batches=3, weights=ON_CPU, cache=ON_CPU,
                        activations=ON_CPU, compress_weight=True, compress_cache=True),
     1.12, 0.25),
]


@pytest.mark.parametrize("name, policy, measured, tolerance", FLEXGEN_RUNS)
def test_other_flexgen_runs(name, policy, measured, tolerance):
    predicted = predict(policy, model_preset(name), T4, FLEXGEN_WORKLOAD).tokens_per_s
    assert predicted == pytest.approx(measured, rel=tolerance)


def test_flexgen_disk_run_is_disk_bound():
    policy = Policy(gpu_batch_size=32, num_gpu_batches=8, weights=_split(0, 50),
                    cache=_split(0, 0), activations=ON_CPU, cpu_attention=True)
    result = predict(policy, model_preset("opt-175b"), T4, FLEXGEN_WORKLOAD)
    assert result.decode_layer_s["dtoc"] > result.decode_layer_s["comp"]


def _policy(**changes) -> Policy:
    return dataclasses.replace(FLEXGEN_OPT30B, **changes)


def test_compression_shrinks_memory_and_adds_dequant_time():
    model = model_preset("opt-30b")
    plain = predict(_policy(), model, T4, FLEXGEN_WORKLOAD)
    packed = predict(_policy(compress_weight=True, compress_cache=True), model, T4,
                     FLEXGEN_WORKLOAD)
    assert packed.peak_bytes["cpu_decode"] < 0.35 * plain.peak_bytes["cpu_decode"]
    assert packed.decode_layer_s["ctog"] < 0.3 * plain.decode_layer_s["ctog"]
    all_gpu = _policy(weights=ON_GPU, cache=ON_GPU, activations=ON_GPU, cpu_attention=False,
                      gpu_batch_size=1, num_gpu_batches=1)
    small = model_preset("opt-6.7b")
    assert (predict(dataclasses.replace(all_gpu, compress_weight=True), small, T4,
                    FLEXGEN_WORKLOAD).decode_layer_s["comp"]
            > predict(all_gpu, small, T4, FLEXGEN_WORKLOAD).decode_layer_s["comp"])


def test_gqa_cache_is_cheaper_than_mha():
    mha, gqa = model_preset("llama-2-7b"), model_preset("llama-3-8b")
    policy = _policy(cpu_attention=False)
    mha_result = predict(policy, mha, T4, FLEXGEN_WORKLOAD)
    gqa_result = predict(policy, gqa, T4, FLEXGEN_WORKLOAD)
    # 8 KV heads instead of 32: a quarter of the cache to move each decode step
    assert gqa_result.peak_bytes["cpu_decode"] < mha_result.peak_bytes["cpu_decode"]
    assert gqa_result.decode_layer_s["ctog"] < 0.5 * mha_result.decode_layer_s["ctog"]


def test_shared_prefix_saves_prefill_and_cache():
    model = model_preset("opt-30b")
    shared = WorkloadSpec(prompt_len=512, gen_len=32, shared_prefix_len=384)
    base = predict(FLEXGEN_OPT30B, model, T4, FLEXGEN_WORKLOAD)
    with_prefix = predict(FLEXGEN_OPT30B, model, T4, shared)
    assert with_prefix.prefill_s < 0.5 * base.prefill_s
    assert with_prefix.peak_bytes["cpu_decode"] < base.peak_bytes["cpu_decode"]


def test_decode_gemm_respects_memory_bandwidth_roofline():
    model = model_preset("opt-6.7b")
    policy = _policy(weights=ON_GPU, cache=ON_GPU, activations=ON_GPU, cpu_attention=False,
                     gpu_batch_size=1, num_gpu_batches=1)
    result = predict(policy, model, T4, FLEXGEN_WORKLOAD)
    weight_read_s = model.weight_bytes_per_layer() / T4.gpu_mem_bytes_per_s
    assert result.decode_layer_s["comp"] >= weight_read_s
    slow_memory = dataclasses.replace(T4, gpu_mem_bytes_per_s=T4.gpu_mem_bytes_per_s / 4)
    assert predict(policy, model, slow_memory, FLEXGEN_WORKLOAD).decode_layer_s["comp"] > \
        3 * result.decode_layer_s["comp"]


def test_sparse_mla_reads_only_selected_cache_entries():
    model = model_preset("deepseek-v3.2-attn")
    long = WorkloadSpec(prompt_len=32768, gen_len=64)
    policy = _policy(gpu_batch_size=4, num_gpu_batches=1, cpu_attention=False, weights=ON_GPU)
    dense = dataclasses.replace(model, index_topk=0)
    assert predict(policy, model, T4, long).decode_layer_s["ctog"] < \
        0.2 * predict(policy, dense, T4, long).decode_layer_s["ctog"]


def test_hardware_spec_validation_and_json():
    assert HardwareSpec.from_json(T4.to_json()) == T4
    with pytest.raises(ValueError, match="gpu_mem_bytes must be a positive number"):
        dataclasses.replace(T4, gpu_mem_bytes=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        dataclasses.replace(T4, gpu_matmul_flops_per_s={"int3": 1.0})
    with pytest.raises(ValueError, match="sum to 1"):
        TierSplit(gpu=0.5, cpu=0.4, disk=0.0)
    with pytest.raises(TypeError):
        TierSplit(0.5, 0.5, 0.0)  # keyword-only
    with pytest.raises(ValueError, match="shared_prefix_len"):
        WorkloadSpec(prompt_len=8, gen_len=8, shared_prefix_len=9)
