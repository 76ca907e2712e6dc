"""Measured GEMM rates by row count and the per-layer overhead in the cost model."""

import dataclasses
import math

import pytest

from placement import HardwareSpec, Policy, TierSplit, WorkloadSpec, hardware_preset, model_preset, predict

T4 = hardware_preset("t4-flexgen")
ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
TABLE = {"fp16": {"1": 1e9, "16": 8e9, "256": 64e9}}
WORKLOAD = WorkloadSpec(prompt_len=64, gen_len=8)


def _policy(gbs: int, ngb: int) -> Policy:
    return Policy(gpu_batch_size=gbs, num_gpu_batches=ngb, weights=ON_GPU, cache=ON_GPU, activations=ON_GPU)


def test_gemm_seconds_interpolates_in_log_rows_and_clamps():
    hw = dataclasses.replace(T4, gpu_gemm_flops_by_rows=TABLE)
    assert hw.gemm_seconds("fp16", 16, 8e9, 0) == pytest.approx(1.0)
    assert hw.gemm_seconds("fp16", 4, 1.0, 0) == pytest.approx(1 / math.sqrt(1e9 * 8e9))  # halfway in log
    assert hw.gemm_seconds("fp16", 1024, 64e9, 0) == pytest.approx(1.0)  # past the end: the last rate
    assert hw.gemm_seconds("fp16", 0.5, 1e9, 0) == pytest.approx(1.0)  # before the start: the first
    # a dtype without a table falls back to the roofline: max(compute, weight streaming)
    assert hw.gemm_seconds("fp32", 1, 1.0, T4.gpu_mem_bytes_per_s) == pytest.approx(1.0)


def test_table_drives_decode_time_and_json_round_trips():
    model = model_preset("opt-6.7b")
    slow = dataclasses.replace(T4, gpu_gemm_flops_by_rows={"fp16": {"1": 1e9, "4096": 1e10}})
    fast = dataclasses.replace(T4, gpu_gemm_flops_by_rows={"fp16": {"1": 1e10, "4096": 1e11}})
    t_slow = predict(_policy(8, 1), model, slow, WORKLOAD).decode_layer_s["comp"]
    t_fast = predict(_policy(8, 1), model, fast, WORKLOAD).decode_layer_s["comp"]
    assert t_slow > 5 * t_fast
    assert HardwareSpec.from_json(slow.to_json()) == slow


def test_layer_overhead_is_paid_per_call_and_layer():
    """Prefill runs each micro-batch; decode runs the merged block once, or each micro-batch
    when `merge_decode` is off."""
    model = model_preset("smollm2-135m")
    overhead = 1e-3
    with_cost = dataclasses.replace(T4, gpu_layer_overhead_s=overhead)
    for ngb in (1, 4):
        for merge in (True, False):
            policy = dataclasses.replace(_policy(2, ngb), merge_decode=merge)
            base = predict(policy, model, T4, WORKLOAD)
            more = predict(policy, model, with_cost, WORKLOAD)
            decode_calls = 1 if merge else ngb
            assert more.decode_layer_s["comp"] - base.decode_layer_s["comp"] == pytest.approx(decode_calls * overhead)
            assert more.prefill_layer_s["comp"] - base.prefill_layer_s["comp"] == pytest.approx(ngb * overhead)


def test_merged_decode_runs_the_block_at_once_and_reserves_its_workspace():
    model = model_preset("smollm2-135m")
    table = dataclasses.replace(T4, gpu_gemm_flops_by_rows={"fp16": {"1": 1e9, "64": 3e10}})
    merged = dataclasses.replace(_policy(8, 8), merge_decode=True)
    split = dataclasses.replace(merged, merge_decode=False)
    # 64 rows at 30 GFLOP/s once beat 8 rows (about 13 GFLOP/s interpolated) eight times
    assert (predict(merged, model, table, WORKLOAD).decode_layer_s["comp"]
            < 0.6 * predict(split, model, table, WORKLOAD).decode_layer_s["comp"])
    assert (predict(merged, model, table, WORKLOAD).peak_bytes["gpu_decode"]
            > predict(split, model, table, WORKLOAD).peak_bytes["gpu_decode"])


@pytest.mark.parametrize("bad", [{"int4": {"1": 1.0}}, {"fp16": {}}, {"fp16": {"0": 1.0}},
                                 {"fp16": {"x": 1.0}}, {"fp16": {"8": -1.0}}])
def test_bad_tables_are_rejected(bad):
    with pytest.raises(ValueError, match="gpu_gemm_flops_by_rows"):
        dataclasses.replace(T4, gpu_gemm_flops_by_rows=bad)


def test_negative_overhead_is_rejected():
    with pytest.raises(ValueError, match="gpu_layer_overhead_s"):
        dataclasses.replace(T4, gpu_layer_overhead_s=-1.0)


def test_dequantization_pays_a_fixed_cost_per_matrix_when_weights_are_compressed():
    model = model_preset("smollm2-135m")
    assert model.matrices_per_layer(1) == 7  # q, k, v, o, gate, up, down
    assert model_preset("opt-6.7b").matrices_per_layer(1) == 6  # q, k, v, o, fc1, fc2
    per_matrix = 1e-4
    with_cost = dataclasses.replace(T4, gpu_dequant_matrix_s=per_matrix)
    compressed = dataclasses.replace(_policy(4, 2), compress_weight=True)
    base = predict(compressed, model, T4, WORKLOAD)
    more = predict(compressed, model, with_cost, WORKLOAD)
    # once per layer per sweep over the block, not per micro-batch
    assert more.decode_layer_s["comp"] - base.decode_layer_s["comp"] == pytest.approx(7 * per_matrix)
    assert more.prefill_layer_s["comp"] - base.prefill_layer_s["comp"] == pytest.approx(7 * per_matrix)
    # dense weights decompress nothing
    assert predict(_policy(4, 2), model, with_cost, WORKLOAD) == predict(_policy(4, 2), model, T4, WORKLOAD)
    assert HardwareSpec.from_json(with_cost.to_json()) == with_cost
    with pytest.raises(ValueError, match="gpu_dequant_matrix_s"):
        dataclasses.replace(T4, gpu_dequant_matrix_s=-1.0)


def test_moe_layers_count_only_the_experts_some_token_picks():
    model = model_preset("deepseek-v3.2")
    assert model.matrices_per_layer(1) < model.matrices_per_layer(64) < model.matrices_per_layer(1e6)


def test_elementwise_passes_are_priced_at_memory_bandwidth():
    smollm2, opt = model_preset("smollm2-135m"), model_preset("opt-6.7b")
    # norms 4h, rotary 10(q + kv), cache write 4kv, activation 2I (SmolLM2: h 576, kv 192, I 1536)
    assert smollm2.elementwise_elements_per_token_per_layer() == 4 * 576 + 10 * (576 + 192) + 4 * 192 + 2 * 1536
    assert opt.elementwise_elements_per_token_per_layer() == 4 * 4096 + 4 * 4096 + 2 * 16384  # no rotary
    slow = dataclasses.replace(T4, gpu_mem_bytes_per_s=1e9)
    policy = _policy(4, 2)
    tokens = 8 * WORKLOAD.prompt_len
    floor = tokens * smollm2.elementwise_elements_per_token_per_layer() * smollm2.dtype_bytes / 1e9
    assert predict(policy, smollm2, slow, WORKLOAD).prefill_layer_s["comp"] >= floor
    assert predict(policy, smollm2, slow, WORKLOAD).prefill_layer_s["comp"] > 2 * predict(
        policy, smollm2, T4, WORKLOAD).prefill_layer_s["comp"]


def test_weights_resident_on_the_gpu_tier_run_at_the_resident_rate():
    model = dataclasses.replace(model_preset("smollm2-135m"), dtype="fp16")
    streamed = {"fp16": {"1": 1e9, "4096": 1e10}}
    hw = dataclasses.replace(T4, gpu_gemm_flops_by_rows=streamed,
                             gpu_gemm_flops_by_rows_resident={"fp16": {"1": 2e9, "4096": 2e10}})
    assert hw.gemm_seconds("fp16", 8, 1e9, 0, resident=True) == pytest.approx(hw.gemm_seconds("fp16", 8, 1e9, 0) / 2)
    plain = dataclasses.replace(T4, gpu_gemm_flops_by_rows=streamed)
    assert plain.gemm_seconds("fp16", 8, 1e9, 0, resident=True) == plain.gemm_seconds("fp16", 8, 1e9, 0)
    off_gpu = TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
    half = TierSplit(gpu=0.5, cpu=0.5, disk=0.0)

    def comp(weights, hardware, **kw):
        policy = Policy(gpu_batch_size=8, num_gpu_batches=1, weights=weights, cache=ON_GPU, activations=ON_GPU, **kw)
        return predict(policy, model, hardware, WORKLOAD).decode_layer_s["comp"]

    # linear in the resident share; streamed weights and compressed ones gain nothing
    assert comp(off_gpu, hw) == pytest.approx(comp(off_gpu, plain))
    gain = comp(off_gpu, hw) - comp(ON_GPU, hw)
    assert gain > 0 and comp(off_gpu, hw) - comp(half, hw) == pytest.approx(gain / 2)
    assert comp(ON_GPU, hw, compress_weight=True) == pytest.approx(comp(ON_GPU, plain, compress_weight=True))
    assert HardwareSpec.from_json(hw.to_json()) == hw
    with pytest.raises(ValueError, match="gpu_gemm_flops_by_rows_resident"):
        dataclasses.replace(T4, gpu_gemm_flops_by_rows_resident={"fp16": {"0": 1.0}})


def test_on_a_host_gpu_cpu_tier_data_is_not_copied_and_disk_copies_join_compute():
    """On a CPU standing in for the GPU both tiers are one memory: what the cpu tier holds is
    used where it is (no link time, no compute); a disk read's copy out of the page cache runs
    on the compute's own cores."""
    model = model_preset("smollm2-135m")
    host = dataclasses.replace(T4, gpu_is_host=True)

    def policy(weights):
        return Policy(gpu_batch_size=4, num_gpu_batches=2, weights=weights, cache=ON_GPU,
                      activations=TierSplit(gpu=0.0, cpu=1.0, disk=0.0))

    half_cpu = policy(TierSplit(gpu=0.5, cpu=0.5, disk=0.0))
    half_disk = policy(TierSplit(gpu=0.5, cpu=0.0, disk=0.5))
    for phase in ("prefill_layer_s", "decode_layer_s"):
        apart = getattr(predict(half_cpu, model, T4, WORKLOAD), phase)
        shared = getattr(predict(half_cpu, model, host, WORKLOAD), phase)
        assert apart["ctog"] > 0 and apart["gtoc"] > 0
        assert shared["ctog"] == shared["gtoc"] == 0
        assert shared["comp"] == pytest.approx(apart["comp"])
        activations_s = getattr(predict(policy(ON_GPU), model, T4, WORKLOAD), phase)["ctog"]
        apart = getattr(predict(half_disk, model, T4, WORKLOAD), phase)
        shared = getattr(predict(half_disk, model, host, WORKLOAD), phase)
        assert shared["ctog"] == 0 and shared["dtoc"] == apart["dtoc"] > 0
        # the disk half's second hop (page cache -> staging) is compute; the activations' is free
        assert shared["comp"] == pytest.approx(apart["comp"] + apart["ctog"] - activations_s)
    assert HardwareSpec.from_json(host.to_json()) == host
    with pytest.raises(ValueError, match="gpu_is_host"):
        dataclasses.replace(T4, gpu_is_host="yes")


def test_4bit_calls_under_the_engines_switch_run_the_fused_kernel_and_over_it_dequantize():
    """The engine multiplies 4-bit weights in place for calls of fewer than int4_dense_from_rows
    rows (priced at the fused kernel's measured rate, nothing dequantized) and dequantizes them
    once a layer and sweep for a dense GEMM on bigger calls (priced as such)."""
    model = model_preset("opt-6.7b")
    hw = dataclasses.replace(T4, gpu_gemm_flops_by_rows=TABLE, gpu_int4_gemm_flops_by_rows={"fp16": {"1": 2e9, "64": 4e9}},
                             int4_dense_from_rows=64, gpu_int4_dequant_bytes_per_s=1e9)
    assert HardwareSpec.from_json(hw.to_json()) == hw
    assert hw.int4_gemm_seconds("fp16", 63, 4e9) == pytest.approx(4e9 / hw_rate(hw, 63))
    assert hw.int4_gemm_seconds("fp16", 64, 4e9) is None and hw.int4_gemm_seconds("fp32", 1, 1.0) is None

    def decode_comp(gbs, ngb, hardware, **kw):
        policy = dataclasses.replace(_policy(gbs, ngb), compress_weight=True, **kw)
        return predict(policy, model, hardware, WORKLOAD).decode_layer_s["comp"]

    no_kernel = dataclasses.replace(hw, gpu_int4_gemm_flops_by_rows={})
    layer_flops = model.matmul_flops_per_token_per_layer()
    dequant_s = model.weight_bytes_per_layer() / model.dtype_bytes * 2 / 1e9
    dequant_s += model.matrices_per_layer(16) * hw.gpu_dequant_matrix_s
    # a merged block of 16 rows: fused, no dequantization; without a kernel: dense + one dequantization
    fused = decode_comp(8, 2, hw)
    dense = decode_comp(8, 2, no_kernel)
    gemm_gap = hw.gemm_seconds("fp16", 16, 16 * layer_flops, 0) - hw.int4_gemm_seconds("fp16", 16, 16 * layer_flops)
    assert dense - fused == pytest.approx(dequant_s + gemm_gap, rel=1e-6)
    # a merged block of 128 rows is past the switch: the same price with or without the kernel
    assert decode_comp(64, 2, hw) == pytest.approx(decode_comp(64, 2, no_kernel))
    with pytest.raises(ValueError, match="int4_dense_from_rows"):
        dataclasses.replace(T4, int4_dense_from_rows=-1)


def hw_rate(hw, rows):
    from placement.specs import _rate_at

    return _rate_at(hw.gpu_int4_gemm_flops_by_rows["fp16"], rows)


def test_4bit_prompts_on_int8_codes_are_priced_at_the_int8_rate():
    """Where the engine runs 4-bit calls of int4_dense_from_rows rows or more on int8 codes (a CPU
    with flexlamps' int8 GEMM), the planner prices their layer matrices at that table's rate; the
    dequantization (the int8 copy's packing) is priced as before, and fewer rows are unaffected."""
    model = model_preset("opt-6.7b")
    base = dataclasses.replace(T4, gpu_gemm_flops_by_rows=TABLE, gpu_int4_gemm_flops_by_rows={"fp16": {"1": 2e9, "64": 4e9}},
                               int4_dense_from_rows=64, gpu_int4_dequant_bytes_per_s=1e9)
    int8 = dataclasses.replace(base, gpu_int8_prompt_flops_by_rows={"fp16": {"64": 100e9, "4096": 200e9}})
    assert HardwareSpec.from_json(int8.to_json()) == int8
    assert int8.int4_prompt_seconds("fp16", 63, 1.0) is None and base.int4_prompt_seconds("fp16", 64, 1.0) is None
    assert int8.int4_prompt_seconds("fp16", 4096, 4e11) == pytest.approx(2.0)

    def comp(hardware, gbs, ngb, phase, compress=True):
        policy = dataclasses.replace(_policy(gbs, ngb), compress_weight=compress)
        return getattr(predict(policy, model, hardware, WORKLOAD), f"{phase}_layer_s")["comp"]

    rows = 32 * WORKLOAD.prompt_len  # one prefill call's rows
    layer_flops = rows * model.matmul_flops_per_token_per_layer()
    saved = int8.gemm_seconds("fp16", rows, layer_flops, 0) - int8.int4_prompt_seconds("fp16", rows, layer_flops)
    assert comp(base, 32, 1, "prefill") - comp(int8, 32, 1, "prefill") == pytest.approx(saved, rel=1e-6)
    assert comp(int8, 32, 1, "prefill", compress=False) == comp(base, 32, 1, "prefill", compress=False)
    assert comp(int8, 8, 2, "decode") == comp(base, 8, 2, "decode")  # 16 rows: the fused kernel
    with pytest.raises(ValueError, match="gpu_int8_prompt_flops_by_rows"):
        dataclasses.replace(T4, gpu_int8_prompt_flops_by_rows={"int8": {"1": 1.0}})


def test_decode_calls_take_the_decode_table_prompts_the_main_one():
    """Where the engine multiplies decode rows with another kernel (16-bit on an AVX2 CPU: a native
    one), the profile's decode table prices decode calls and the main table prompt calls."""
    model = model_preset("smollm2-135m")
    main = {model.dtype: {"1": 1e9, "2048": 1e9}}
    hw = dataclasses.replace(T4, gpu_gemm_flops_by_rows=main, gpu_layer_overhead_s=0.0)
    base = predict(_policy(8, 1), model, hw, WORKLOAD)
    fast_decode = dataclasses.replace(hw, gpu_gemm_flops_by_rows_decode={model.dtype: {"1": 4e9, "128": 4e9}})
    split = predict(_policy(8, 1), model, fast_decode, WORKLOAD)
    assert split.prefill_layer_s == base.prefill_layer_s
    assert split.decode_layer_s["comp"] < base.decode_layer_s["comp"]
    gemm = 8 * (model.matmul_flops_per_token_per_layer() + model.head_flops_per_token() / model.num_layers)
    saved = base.decode_layer_s["comp"] - split.decode_layer_s["comp"]
    assert saved == pytest.approx(gemm * (1 / 1e9 - 1 / 4e9), rel=1e-6)


def test_the_gemm_probe_multiplies_in_the_phase_it_is_given(monkeypatch):
    """The dense tables time `linear` on calls of the phase they price (decode rows may take another kernel)."""
    import torch

    from flexlamps.hardware import probes
    from flexlamps.models.blocks.weight_kind import Phase

    seen = set()
    engine_linear = probes.linear
    monkeypatch.setattr(probes, "linear", lambda x, w, phase=None: seen.add(phase) or engine_linear(x, w, phase=phase))
    for phase in Phase:
        table = probes.measure_gemm_by_rows(torch.device("cpu"), 1 << 16, 0.01, ("bf16",), ((32, 32),), phase=phase,
                                            row_counts=(1, 8))
        assert list(table["bf16"]) == ["1", "8"]
    assert seen == set(Phase)
