"""Where a MoE layer's cpu-tier experts are computed, as the planner prices it: on the CPU where
they live while few tokens route to each, copied to the GPU for a batched GEMM when many do."""

import dataclasses

import pytest

import placement
from tests.described import described
from placement.expert_compute import cpu_expert_tokens, tokens_per_expert

ON_GPU = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
ON_CPU = placement.TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
# Mixtral-8x7B's shape: 8 experts of 3 x 4096 x 14336 bf16 (336 MiB each), top-2
MIXTRAL = dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
               vocab_size=32000, torch_dtype="bfloat16")


def _model():
    return described(MIXTRAL)[1]


def test_the_switch_is_where_copying_an_expert_beats_streaming_it_on_the_cpu():
    """RTX 4090 preset: a 336 MiB expert crosses PCIe (22 GB/s) in 16 ms; the CPU streams it in
    7 ms (50 GB/s) and does 0.35 ms of FLOPs per token (1 TFLOP/s), so in place wins below
    ~46 tokens per expert."""
    model, hw = _model(), placement.hardware_preset("rtx4090")
    expert = 3 * 4096 * 14336 * 2
    expected = next(t for t in range(1, 200)
                    if max(expert / hw.cpu_memory_bytes_per_s, t * 2 * expert / 2 / 1e12) >= expert / (22e9))
    assert cpu_expert_tokens(model, hw, compressed=False, most_tokens=1000) == expected
    assert 30 < expected < 60
    # 4-bit experts beside a GPU stay in its kernel's layout: always copied; a CPU-only machine: always in place
    assert cpu_expert_tokens(model, hw, compressed=True, most_tokens=1000) == 0
    host = dataclasses.replace(hw, gpu_is_host=True)
    assert cpu_expert_tokens(model, host, compressed=False, most_tokens=1000) == 1001


def _predict(policy, model=None):
    return placement.predict(policy, model or _model(), placement.hardware_preset("rtx4090"),
                             placement.WorkloadSpec(prompt_len=64, gen_len=32))


@pytest.mark.parametrize("batch", [1, 64])
def test_decode_prices_in_place_experts_at_the_cpu_rates_and_copied_ones_over_the_link(batch):
    """Experts on the cpu tier: in place, a decode step's copies keep the dense weights but not
    the experts, and compute gains the CPU's time; a batch of 64 routes 16 tokens to each of the
    8 experts, still under the switch (46)."""
    model = _model()
    policy = placement.Policy(gpu_batch_size=batch, num_gpu_batches=1, weights=ON_CPU, cache=ON_GPU,
                              activations=ON_GPU)
    copied = _predict(policy)
    in_place = _predict(dataclasses.replace(policy, cpu_expert_tokens=46))
    experts_read = model.routed_expert_bytes_per_layer() * model.expected_experts(batch) / 8
    hw = placement.hardware_preset("rtx4090")
    assert copied.decode_layer_s["ctog"] - in_place.decode_layer_s["ctog"] == pytest.approx(
        experts_read / hw.cpu_to_gpu_bytes_per_s, rel=1e-9)
    assert in_place.decode_layer_s["comp"] > copied.decode_layer_s["comp"]
    assert in_place.tokens_per_s > copied.tokens_per_s
    assert tokens_per_expert(model, batch) < 46


def test_solve_hands_the_engine_its_switch():
    model, hw = _model(), placement.hardware_preset("rtx4090").with_memory(gpu_mem_bytes=8 << 30,
                                                                            cpu_mem_bytes=128 << 30)
    plan = placement.solve(model, hw, placement.WorkloadSpec(prompt_len=64, gen_len=32), max_block_size=8,
                           allow_weight_compression=False)
    assert plan.policy.weights.cpu > 0.5
    assert plan.policy.cpu_expert_tokens == cpu_expert_tokens(model, hw, compressed=False, most_tokens=64 * 8)
    assert placement.Policy.from_json(plan.policy.to_json()) == plan.policy


def test_flexlamps_plan_says_how_experts_are_read_and_where_they_run(tmp_path):
    import json

    from click.testing import CliRunner

    from flexlamps.commands.plan import command as plan_command

    config = tmp_path / "config.json"
    config.write_text(json.dumps(MIXTRAL))
    out = CliRunner().invoke(plan_command, ["--model", str(config), "--hardware", "rtx4090", "--gpu-mem", "8GiB",
                                            "--prompt-len", "64", "--gen-len", "32", "--no-compress"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("experts"))
    assert "uniform routing: 2.0 of 8 a token" in line
    assert "on the CPU where they live below 46 tokens per expert" in line
