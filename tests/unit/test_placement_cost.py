"""The cost model against FlexGen's published numbers, and each extension's direction."""

import dataclasses

import pytest

from placement import (HardwareSpec, Policy, TierSplit, WorkloadSpec, evaluate, hardware_preset,
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
    # the engine's 4-bit weights: groups of 32 with a 16-bit scale and zero point, 0.3125x
    assert packed.decode_layer_s["ctog"] < 0.33 * plain.decode_layer_s["ctog"]
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


def _flexgen_weight_split(model, gpu_percent: int, cpu_percent: int) -> TierSplit:
    """The byte shares FlexGen's `init_weight_list` really puts on each tier for `--percent
    gpu cpu` on an OPT model: per FlexGen layer (the two embedding layers, each attention and
    each MLP block), every tensor goes to the tier where the middle of its bytes falls, walking
    the disk share first, then the cpu share, then the gpu share. OPT-30B's "20 80" leaves only
    the out projection of each attention block on the GPU: 8% of the bytes, not 20%."""
    h, vocab = model.hidden_size, model.vocab_size
    attention = [h * h, h] * 4 + [h, h]
    mlp = [4 * h * h, 4 * h, 4 * h * h, h, h, h]
    groups = [[vocab * h, 2050 * h], [h, h, vocab * h]] + [attention, mlp] * model.num_layers
    ends = [100 - gpu_percent - cpu_percent, 100 - gpu_percent, 100]  # disk, cpu, gpu
    placed = [0, 0, 0]
    for sizes in groups:
        done = 0
        for size in sizes:
            middle = 100 * (done + size / 2) / sum(sizes)
            placed[next(i for i, end in enumerate(ends) if middle < end or i == 2)] += size
            done += size
    total = sum(placed)
    return TierSplit(gpu=placed[2] / total, cpu=placed[1] / total, disk=placed[0] / total)


# FlexGen's bench_suite.py policies for the T4 (prompt 512, output 32), as FlexGen's engine
# ran them (weights split by its rule, decode one micro-batch at a time), and tok/s measured
FLEXGEN_SUITE = [
    ("opt-6.7b", dict(gpu_batch_size=2, num_gpu_batches=1, w=(100, 0), cache=ON_GPU, activations=ON_GPU), 25.26),
    ("opt-6.7b", dict(gpu_batch_size=72, num_gpu_batches=1, w=(100, 0), cache=ON_GPU, activations=ON_GPU,
                      compress_weight=True, compress_cache=True), 29.12),
    ("opt-30b", dict(gpu_batch_size=48, num_gpu_batches=3, w=(20, 80), cache=ON_CPU, activations=ON_CPU,
                     cpu_attention=True), 7.32),
    ("opt-30b", dict(gpu_batch_size=64, num_gpu_batches=8, w=(0, 100), cache=ON_CPU, activations=ON_CPU,
                     compress_cache=True), 8.38),
    ("opt-175b", dict(gpu_batch_size=32, num_gpu_batches=8, w=(0, 50), cache=_split(0, 0), activations=ON_CPU,
                      cpu_attention=True), 0.69),
    ("opt-175b", dict(gpu_batch_size=48, num_gpu_batches=3, w=(0, 100), cache=ON_CPU, activations=ON_CPU,
                      compress_weight=True, compress_cache=True), 1.12),
]


def _flexgen_policy(model, w, **knobs) -> Policy:
    return Policy(weights=_flexgen_weight_split(model, *w), merge_decode=False, **knobs)


@pytest.mark.parametrize("name, knobs, measured", FLEXGEN_SUITE)
def test_flexgens_measured_policies_fit_the_t4(name, knobs, measured):
    """Each ran on the real T4, so each fits the preset's memory (the whole card: the planner's
    own 10% margin is for the plans it makes, FlexGen's runs did without it)."""
    model = model_preset(name)
    plan = evaluate(_flexgen_policy(model, **knobs), model, T4, FLEXGEN_WORKLOAD, usable_fraction=1.0)
    # FlexGen's 4-bit weights (groups of 64 output channels) take 0.281x their fp16 bytes; ours
    # (groups of 32 input channels: GGUF's blocks, the int4 kernel's format) 0.3125x, which
    # its OPT-175B run with every compressed weight on the CPU has to hold on top
    layout = model.total_weight_bytes() * (0.3125 - 0.28125) if knobs.get("compress_weight") else 0
    for tier in ("gpu", "cpu", "disk"):
        assert plan.peak_bytes[tier] - layout <= plan.budget_bytes[tier], (tier, plan.peak_bytes[tier] / 2**30)


def test_flexgens_opt30b_policy_as_it_ran():
    model = model_preset("opt-30b")
    split = _flexgen_weight_split(model, 20, 80)
    assert split.gpu == pytest.approx(1 / 12, abs=0.005)  # the out projections (and the vectors)
    plan = evaluate(_flexgen_policy(model, **FLEXGEN_SUITE[2][1]), model, T4, FLEXGEN_WORKLOAD)
    assert plan.peak_bytes["gpu"] <= plan.budget_bytes["gpu"]  # within the planner's own margin too
    assert plan.tokens_per_s == pytest.approx(FLEXGEN_OPT30B_TOK_S, rel=0.15)
