"""A MoE decode layer reads a routed expert off disk only once its router has named it: the planner
prices those reads after the layer's work before the router (norms, attention, the dense products,
its share of the head), and the last expert read as computed after it lands (the decode term
"routed", `cost_experts.routed_reads_s`); a dense model has nothing that waits."""

import dataclasses

import pytest

import placement
from tests.described import described
from tests.unit.test_placement_expert_hits import QWEN3_MOE

WORKLOAD = placement.WorkloadSpec(prompt_len=16, gen_len=8)
ON_GPU = placement.TierSplit(gpu=1, cpu=0, disk=0)


def _decode(model, hw, disk_share: float) -> placement.CostBreakdown:
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, cache=ON_GPU, activations=ON_GPU,
                              weights=placement.TierSplit.clipped(0.0, 1 - disk_share, disk_share))
    return placement.predict(policy, model, hw, WORKLOAD)


def _cpu_host(gemm_flops: float) -> placement.HardwareSpec:
    """A CPU standing in for the GPU (one memory), its GEMMs at `gemm_flops` whatever the rows."""
    table = {"bf16": {"1": gemm_flops, "64": gemm_flops}}
    return dataclasses.replace(placement.hardware_preset("rtx4090"), gpu_is_host=True, gpu_gemm_flops_by_rows=table,
                               gpu_gemm_flops_by_rows_decode={}, gpu_expert_flops_by_rows={}, gpu_mem_bytes=1 << 20)


def test_the_routed_reads_wait_for_the_work_before_the_router():
    """Half the weights on disk (routed experts only): the reads' term is the disk time plus what
    the layer computes before its router and the last read expert's product, the same compute with
    nothing on disk, where it is a part of the layer's compute (not all of it)."""
    model = described(QWEN3_MOE)[1]
    hw = _cpu_host(2e10)
    none, half = _decode(model, hw, 0.0).decode_layer_s, _decode(model, hw, 0.5).decode_layer_s
    assert half["dtoc"] > 0 and none["dtoc"] == 0
    assert half["routed"] - half["dtoc"] == pytest.approx(none["routed"], rel=1e-9)
    assert 0 < none["routed"] < none["comp"]


def test_a_step_whose_reads_outlast_the_overlap_is_priced_by_them():
    """A disk whose reads take 0.9 of the layer's compute: with the work before the router they
    outlast both, and the step is priced by them (LP and predict alike); before, by the compute."""
    model = described(QWEN3_MOE)[1]
    hw = _cpu_host(2e10)
    terms = _decode(model, hw, 0.5).decode_layer_s
    hw = dataclasses.replace(hw, disk_read_bytes_per_s=hw.disk_read_bytes_per_s * terms["dtoc"] / (0.9 * terms["comp"]))
    priced = _decode(model, hw, 0.5)
    terms = priced.decode_layer_s
    assert terms["dtoc"] == pytest.approx(0.9 * terms["comp"], rel=1e-9)
    assert terms["routed"] > terms["comp"]
    steps = WORKLOAD.gen_len - 1
    assert priced.decode_s == pytest.approx(model.num_layers * steps * terms["routed"], rel=1e-9)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, cache=ON_GPU, activations=ON_GPU,
                              weights=placement.TierSplit.clipped(0.0, 0.5, 0.5))
    assert placement.evaluate(policy, model, hw, WORKLOAD).decode_s == pytest.approx(priced.decode_s, rel=1e-9)


def test_a_dense_model_has_no_reads_that_wait():
    dense = {k: v for k, v in QWEN3_MOE.items() if k not in ("moe_intermediate_size", "num_experts",
                                                              "num_experts_per_tok")}
    model = described(dict(dense, model_type="qwen2"))[1]
    assert _decode(model, _cpu_host(2e10), 0.5).decode_layer_s["routed"] == 0.0
