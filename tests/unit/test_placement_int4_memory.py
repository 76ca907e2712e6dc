"""The planner reserves for 4-bit weights what the offload engine charges for them: nothing on
calls the fused kernel multiplies in place, one (stacked) matrix on calls that dequantize."""

import pytest
import torch

import placement
from flexlamps.engine.executors.charges import PlacementCharges
from flexlamps.engine.executors.offloaded import CAPABILITIES
from placement.cost import Choice, _dequantized_bytes, _sizes

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
    model = placement.ModelSpec.from_hf_config(config)
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_gpu, cache=on_gpu,
                              activations=on_gpu, compress_weight=True)
    charges = PlacementCharges(config, policy, DTYPES[dtype_name], int4=True, device_type="cpu")
    choice = Choice.of(policy)
    planned = _dequantized_bytes(choice, _sizes(choice, model, placement.WorkloadSpec(prompt_len=8, gen_len=4)), model, rows)
    assert planned == charges.int4_decompressed(0, rows)
    in_place = rows < CAPABILITIES.int4_in_place_below_rows and dtype_name != "float32"
    assert (planned == 0) == in_place


def test_the_engines_switch_is_what_the_planner_assumes_by_default():
    assert Choice(gpu_batch_size=1, num_gpu_batches=1).int4_in_place_below_rows == CAPABILITIES.int4_in_place_below_rows
