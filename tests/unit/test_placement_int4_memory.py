"""The planner reserves for 4-bit weights what the offload engine charges for them: nothing on
calls the fused kernel multiplies in place, one (stacked) matrix on calls that dequantize."""

import dataclasses

import pytest
import torch

import placement
from flexlamps.models.config import ModelConfig
from tests.described import described
from flexlamps.engine.executors.charges import PlacementCharges
from flexlamps.engine.executors.offloaded import CAPABILITIES
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS, KINDS
from flexlamps.models.blocks.weight_kind import EXPANDED_ON_ARRIVAL
from placement.choice import Choice
from placement.cost_memory import dequantized_bytes, largest_called_matrix
from placement.layer_sizes import layer_sizes
from quant.fp8 import Fp8Weight
from quant.int4_weight import Int4Weight

LLAMA = dict(model_type="llama", hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, intermediate_size=1536, vocab_size=1024)
OPT = dict(model_type="opt", hidden_size=512, num_hidden_layers=2, num_attention_heads=8, ffn_dim=2048,
           vocab_size=1024, max_position_embeddings=256)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.mark.parametrize("config", [LLAMA, OPT], ids=["llama", "opt"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("rows", [1, 32, 127, 128, 512])
def test_planned_dequantized_bytes_equal_the_engines_charge(config, dtype_name, rows):
    config = dict(config, torch_dtype=dtype_name)
    model = described(config)[1]
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_gpu, cache=on_gpu,
                              activations=on_gpu, compress_weight=True)
    charges = PlacementCharges.on_paper(ModelConfig.from_hf(config), policy, DTYPES[dtype_name], int4=True,
                                        model_spec=model, device_type="cpu")
    choice = Choice.of(policy)
    planned = dequantized_bytes(choice, layer_sizes(choice, model, placement.WorkloadSpec(prompt_len=8, gen_len=4)), model, rows)
    assert planned == charges.call_copies(0, rows)
    in_place = rows < CAPABILITIES.int4_in_place_below_rows and dtype_name != "float32"
    assert (planned == 0) == in_place


def test_the_engines_switch_is_what_the_planner_assumes_by_default():
    assert Choice(gpu_batch_size=1, num_gpu_batches=1).int4_in_place_below_rows == CAPABILITIES.int4_in_place_below_rows


def _planned_layer_s_and_bytes(hw, dtype: str, rows: int):
    """A bf16/fp16 llama's decode of `rows` merged rows, 4-bit, all weights on the gpu tier:
    (GEMM seconds of a decode layer, planned gpu bytes at decode)."""
    model = described(dict(LLAMA, torch_dtype=dtype))[1]
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=rows, num_gpu_batches=1, weights=on_gpu, cache=on_gpu,
                              activations=on_gpu, compress_weight=True)
    run = placement.predict(policy, model, hw, placement.WorkloadSpec(prompt_len=8, gen_len=4))
    return run.decode_layer_s["comp"], run.peak_bytes["gpu_decode"]


@pytest.mark.parametrize("preset", ["t4-flexgen", "a100-80gb", "rtx3090", "h100-80gb"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_time_and_memory_follow_one_kernel_rule_on_presets(preset, dtype):
    """A preset GPU prices 4-bit decode on the fused kernel exactly where the plan reserves no
    dense copy: Ampere and later in bf16 (torch's CUDA kernel: sm80+, bf16 only, rated from
    gpt-fast's published run); a T4, or fp16 anywhere, dequantizes, and reserves the matrix."""
    hw = placement.hardware_preset(preset)
    fused = placement.int4_runs_in_place(hw, {"bfloat16": "bf16", "float16": "fp16"}[dtype])
    assert fused == (preset != "t4-flexgen" and dtype == "bfloat16")
    rows = 8
    comp_s, gpu_bytes = _planned_layer_s_and_bytes(hw, dtype, rows)
    # without a kernel the same plan costs a dequantization and holds a matrix more
    no_kernel = dataclasses.replace(hw, gpu_int4_gemm_flops_by_rows={})
    comp_dense_s, gpu_dense_bytes = _planned_layer_s_and_bytes(no_kernel, dtype, rows)
    model = described(dict(LLAMA, torch_dtype=dtype))[1]
    matrix = largest_called_matrix(model) * model.dtype_bytes
    if fused:
        assert gpu_dense_bytes - gpu_bytes == pytest.approx(matrix)
        assert comp_s < comp_dense_s
    else:
        assert (comp_dense_s, gpu_dense_bytes) == (comp_s, gpu_bytes)
    # the engine's charges under the same rule hold the same dense bytes as the plan
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=rows, num_gpu_batches=1, weights=on_gpu, cache=on_gpu,
                              activations=on_gpu, compress_weight=True)
    config, spec = described(dict(LLAMA, torch_dtype=dtype))
    charges = PlacementCharges.on_paper(config, policy, DTYPES[dtype], model_spec=spec,
                                        int4=True, device_type="cuda", fused_int4=fused)
    assert charges.call_copies(0, rows) == (0 if fused else matrix)


def test_a_sweep_of_prompt_chunks_holds_the_layer_dense_in_plan_and_engine():
    """Several prompt chunks of 128+ rows: the engine dequantizes a layer's 4-bit matrices once
    for all of them (and holds them dense); the plan reserves that, and prices one pass."""
    model = described(dict(LLAMA, torch_dtype="bfloat16"))[1]
    sizes = layer_sizes(Choice(gpu_batch_size=2, num_gpu_batches=3, compress_weight=True), model,
                   placement.WorkloadSpec(prompt_len=8, gen_len=4))
    choice = Choice(gpu_batch_size=2, num_gpu_batches=3, compress_weight=True)
    one_call = dequantized_bytes(choice, sizes, model, 256, calls=1)
    three_calls = dequantized_bytes(choice, sizes, model, 256, calls=3)
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=2, num_gpu_batches=3, weights=on_gpu, cache=on_gpu,
                              activations=on_gpu, compress_weight=True)
    config, spec = described(dict(LLAMA, torch_dtype="bfloat16"))
    charges = PlacementCharges.on_paper(config, policy, torch.bfloat16, model_spec=spec, int4=True, device_type="cpu")
    assert one_call == charges.call_copies(0, 256)
    assert three_calls == charges.sweep_copies(0)
    steps = [(2, 128, 128)] * 3
    assert charges.takes_sweep_copies(0, steps) and not charges.takes_sweep_copies(0, steps[:1])
    # room for everything but the dense copies: the sweep falls back to one matrix a call
    room = charges.sweep_gpu_peak(steps, room=None)
    assert charges.sweep_gpu_peak(steps, room=room) == room
    tight = charges.sweep_gpu_peak(steps, room=room - 1)
    assert tight == room - charges.sweep_copies(0) + charges.call_copies(0, 256)


def test_each_kind_says_what_its_calls_hold():
    """The charges ask the kind (`WeightKind.call_bytes` ...): a 4-bit matrix holds a dense copy on
    the dense path only (many rows, or no fused kernel), an FP8 one on every call, a dense one
    never; a group-wise QTensor is expanded when its layer arrives."""
    shape, matrix = (256, 512), 256 * 512 * 2
    int4, fp8, dense = KINDS[Int4Weight], KINDS[Fp8Weight], KINDS[torch.Tensor]
    assert int4.call_bytes(shape, INT4_DENSE_FROM_ROWS - 1, 2) == 0
    assert int4.call_bytes(shape, INT4_DENSE_FROM_ROWS, 2) == matrix == int4.call_bytes(shape, 1, 2, fused=False)
    assert int4.keeps_sweep_copy([INT4_DENSE_FROM_ROWS] * 2) and not int4.keeps_sweep_copy([INT4_DENSE_FROM_ROWS, 1])
    assert fp8.call_bytes(shape, 1, 2) == matrix and fp8.sweep_bytes(shape, 2) == 0
    assert dense.call_bytes(shape, 4096, 2) == 0 == dense.arrival_bytes(shape, 2)
    assert EXPANDED_ON_ARRIVAL.arrival_bytes(shape, 2) == matrix == EXPANDED_ON_ARRIVAL.call_bytes(shape, 1, 2) + matrix
