"""The planner sizes FP8 checkpoints and ESS's FP8 latent cache as they are stored."""

import dataclasses

import pytest

import placement
from tests.described import described, plan_target
from flexlamps.models.presets import MODEL_CONFIGS

V32 = placement.model_preset("deepseek-v3.2")
V32_FP8 = placement.model_preset("deepseek-v3.2-exp")


def test_fp8_checkpoint_is_sized_at_one_byte_per_matrix_parameter():
    assert V32.weight_format == "dense" and V32_FP8.weight_format == "fp8"
    vectors = V32.vector_param_count() * V32.dtype_bytes
    per_layer_bf16, per_layer_fp8 = V32.weight_bytes_per_layer(), V32_FP8.weight_bytes_per_layer()
    # matrices: 2 bytes -> 1 byte plus one fp32 scale per 128x128 tile; vectors unchanged; a little
    # more for the partial tiles (kv_a's 576 rows) and the routers (bf16, as DeepSeek ships them)
    assert per_layer_fp8 - vectors == pytest.approx((per_layer_bf16 - vectors) / 2 * (1 + 4 / 128 ** 2), rel=3e-4)
    # DeepSeek-V3.2-Exp: 671B parameters, about 670 GB in FP8 plus bf16 embeddings
    assert 660e9 < V32_FP8.total_weight_bytes() < 690e9
    assert V32_FP8.weight_bytes_touched_per_layer(1) < V32.weight_bytes_touched_per_layer(1) / 1.9


def test_ess_latent_layout():
    plain = V32_FP8
    fp8 = dataclasses.replace(plain, cache_format="fp8")
    assert plain.cache_bytes_per_token_per_layer() == (512 + 64) * 2
    assert fp8.cache_bytes_per_token_per_layer() == 656
    assert fp8.indexer_bytes_per_token_per_layer() == 132


def test_bad_formats_are_named():
    with pytest.raises(ValueError, match="cache_format 'fp8' is the MLA latent layout"):
        dataclasses.replace(placement.model_preset("llama-3-8b"), cache_format="fp8")
    with pytest.raises(ValueError, match="weight_format must be one of"):
        dataclasses.replace(V32, weight_format="int3")
    with pytest.raises(ValueError, match="quant_method 'gptq' is not supported"):
        described(dict(MODEL_CONFIGS["deepseek-v3.2"], quantization_config={"quant_method": "gptq"}))[1]


def test_plan_prints_fp8_weights_and_the_latent_pools(tmp_path):
    import json

    from click.testing import CliRunner

    from flexlamps.cli import main

    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 8, "num_gpu_batches": 1, "weights": {"gpu": 0.1, "cpu": 0.9, "disk": 0},
        "cache": {"gpu": 0.25, "cpu": 0.75, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    res = CliRunner().invoke(main, ["plan", "--model", "deepseek-v3.2-exp", "--hardware", "h200",
                                    "--prompt-len", "32768", "--gen-len", "256", "--policy", str(policy)])
    assert res.exit_code == 0, res.output
    assert "of fp8 weights" in res.output
    # no per-layer pools in the policy: a quarter of the 33024-token context for every layer
    assert "(of 33024, top-k 2048), min 8256, mean 8256, max 8256" in res.output
    assert "miss curves: ESS's curves" in res.output


def test_the_engine_plans_fp8_checkpoints_at_the_size_it_holds_them():
    """The engine keeps FP8 matrices FP8 (upcast per call): its plan counts them as stored, and
    the executor's charges for DeepSeek-V3.2-Exp's weights equal the planner's total."""
    import torch

    from flexlamps.engine.executors.charges import PlacementCharges
    from flexlamps.planning.policy_choice import plan_policy
    from flexlamps.planning.target import BlockLengths, Compression

    hf = dict(MODEL_CONFIGS["deepseek-v3.2-exp"])
    hw = placement.hardware_preset("h200")
    common = dict(gpu_mem=hw.gpu_mem_bytes, cpu_mem=hw.cpu_mem_bytes, disk_bytes=None,
                  compression=Compression(allow=False))
    dense = {k: v for k, v in hf.items() if k != "quantization_config"}
    lengths = BlockLengths(prompt_len=512, gen_len=32)
    with_fp8 = plan_policy(plan_target(hf, torch.bfloat16), hw, lengths, **common)
    without = plan_policy(plan_target(dense, torch.bfloat16), hw, lengths, **common)
    assert 0.4 < with_fp8.peak_bytes["cpu"] / without.peak_bytes["cpu"] < 0.5  # the gpu tier is full in both
    on_cpu = placement.TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_cpu, cache=on_cpu, activations=on_cpu)
    config, spec = described(hf)
    charges = PlacementCharges.on_paper(config, policy, torch.bfloat16, model_spec=spec, device_type="cpu")
    charged = sum(charges.store.stored.values())
    planned = dataclasses.replace(V32_FP8, dtype="bf16").total_weight_bytes()
    assert charged == pytest.approx(planned, rel=1e-3)  # 627.7 GiB either way


def test_fp8_weights_cost_an_upcast_per_call_unless_compressed():
    from placement.choice import Choice
    from placement.weight_calls import fp8_upcast_s

    hw = placement.hardware_preset("h200")
    plain, compressed = Choice(gpu_batch_size=8, num_gpu_batches=1), Choice(gpu_batch_size=8, num_gpu_batches=1,
                                                                             compress_weight=True)
    layer = V32_FP8.weight_bytes_per_layer()
    upcast = fp8_upcast_s(plain, V32_FP8, hw, layer)
    # the layer's matrices in bf16 (about twice their FP8 bytes) at the dequantization rate
    assert upcast == pytest.approx(2 * layer / hw.gpu_dequant_bytes_per_s, rel=0.02)
    assert fp8_upcast_s(compressed, V32_FP8, hw, layer) == 0 == fp8_upcast_s(plain, V32, hw, layer)
