"""Every GPU preset prices 4-bit weights on the path the engine takes on that GPU: torch's fused
kernel for decode-sized calls in bf16 from compute capability 8.0 (A100, RTX 3090/4090, H100,
H200), dequantization then the dense GEMM where the kernel does not run (a T4, fp16 activations,
prompt-sized calls), as `quant.int4_weight` and `models.blocks.linear` decide it."""

import dataclasses

import pytest
import torch

import placement
from placement.choice import Choice
from placement.presets import CUDA_CAPABILITY, HARDWARE_PRESETS
from placement.weight_calls import runs_fused_int4
from quant.int4_weight import CUDA_KERNEL_DTYPES, CUDA_KERNEL_MIN_CAPABILITY

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _engine_fuses(preset: str, dtype: str, rows: int) -> bool:
    """The engine's rule on that GPU: the kernel's capability and dtype, under its row switch."""
    return (CUDA_CAPABILITY[preset] >= CUDA_KERNEL_MIN_CAPABILITY
            and DTYPES[dtype] in CUDA_KERNEL_DTYPES
            and rows < placement.EngineCapabilities().int4_in_place_below_rows)


def test_every_gpu_preset_has_a_compute_capability():
    assert set(CUDA_CAPABILITY) == set(HARDWARE_PRESETS)


@pytest.mark.parametrize("preset", sorted(HARDWARE_PRESETS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("rows", [1, 16, 64, 128, 512])
def test_four_bit_calls_are_priced_on_the_engines_path(preset, dtype, rows):
    hw = placement.hardware_preset(preset)
    model = dataclasses.replace(placement.model_preset("llama-3-8b"), dtype=dtype)
    choice = Choice(gpu_batch_size=rows, num_gpu_batches=1, compress_weight=True,
                    int4_kernel=placement.int4_runs_in_place(hw, dtype))
    assert runs_fused_int4(choice, model, hw, rows) == _engine_fuses(preset, dtype, rows)


@pytest.mark.parametrize("preset", ["rtx4090", "a100-80gb", "h100-80gb"])
def test_a_compressed_decode_plan_on_an_ampere_or_later_preset_prices_the_fused_kernel(preset):
    """Llama-3-8B in bf16, 4-bit weights: the decode step's compute has no dequantization term
    (what the fused kernel saves), and is faster than the same step priced by dequantizing."""
    hw = placement.hardware_preset(preset)
    model = placement.model_preset("llama-3-8b")
    gpu = placement.TierSplit(gpu=1, cpu=0, disk=0)
    policy = placement.Policy(gpu_batch_size=8, num_gpu_batches=1, weights=gpu, cache=gpu, activations=gpu,
                              compress_weight=True)
    workload = placement.WorkloadSpec(prompt_len=128, gen_len=32)
    fused = placement.predict(policy, model, hw, workload).decode_layer_s["comp"]
    unfused_hw = dataclasses.replace(hw, gpu_int4_gemm_flops_by_rows={}, int4_dense_from_rows=0)
    dequantized = placement.predict(policy, model, unfused_hw, workload).decode_layer_s["comp"]
    assert fused < 0.5 * dequantized
