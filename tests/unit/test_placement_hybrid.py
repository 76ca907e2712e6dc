"""The planner's view of hybrid gated-DeltaNet models (torch-free): KV only for the full-attention
layers, a fixed state per sequence, and how many sequences a placement holds beside the same model
with every layer full attention."""

import dataclasses
import json

from click.testing import CliRunner

from flexlamps.commands.plan import command as plan_command
from flexlamps.models.config import ModelConfig
from tests.described import described
from placement import Policy, TierSplit, WorkloadSpec, evaluate, hardware_preset
from placement.hybrid_fit import all_full_attention, sequences_that_fit

# Qwen3-Next-80B-A3B's shape (its config.json's fields)
QWEN3_NEXT_80B = {
    "model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "max_position_embeddings": 262144, "rope_theta": 10000000, "partial_rotary_factor": 0.25,
    "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
    "num_experts": 512, "torch_dtype": "bfloat16"}


def test_kv_only_in_full_attention_layers_and_a_fixed_state_per_sequence():
    spec = described(QWEN3_NEXT_80B)[1]
    cfg = ModelConfig.from_hf(QWEN3_NEXT_80B)
    assert spec.num_linear_layers == 36 and cfg.num_kv_layers == 12
    kv_per_token = 12 * 2 * 2 * 256 * 2  # 12 layers, K and V, 2 kv heads x 256, bf16
    assert spec.num_layers * spec.cache_bytes_per_token_per_layer() == kv_per_token == cfg.kv_bytes_per_token(2)
    # conv window bf16, recurrent fp32, and the open chunk: 15 tokens' k | v | beta bf16 and g fp32
    state = 36 * ((2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4 + 15 * ((16 * 128 + 32 * 128 + 32) * 2 + 32 * 4))
    assert spec.num_layers * spec.state_bytes_per_sequence_per_layer() == state == cfg.state_bytes_per_sequence(2)
    assert 79.0e9 < spec.total_weight_bytes() / 2 < 81.0e9  # ~80B parameters
    full = all_full_attention(spec)
    assert full.num_layers * full.cache_bytes_per_token_per_layer() == 4 * kv_per_token
    assert full.state_bytes_per_sequence_per_layer() == 0


def test_the_state_is_charged_per_sequence_on_the_cache_tiers():
    spec = described(QWEN3_NEXT_80B)[1]
    hw, wl = hardware_preset("rtx4090"), WorkloadSpec(prompt_len=512, gen_len=32)
    cpu = TierSplit(gpu=0, cpu=1, disk=0)
    policy = Policy(gpu_batch_size=4, num_gpu_batches=2, weights=TierSplit(gpu=0.1, cpu=0.4, disk=0.5), cache=cpu,
                    activations=cpu)
    peak = evaluate(policy, spec, hw, wl).peak_bytes["cpu"]
    small = dataclasses.replace(spec, linear_conv_kernel=1, linear_value_head_dim=1)  # the same weights
    saved = spec.state_bytes_per_sequence_per_layer() - small.state_bytes_per_sequence_per_layer()
    assert peak > evaluate(policy, small, hw, wl).peak_bytes["cpu"] + 8 * spec.num_layers * saved * 0.99


def test_plan_prints_the_sequences_that_fit_beside_all_full_attention(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_NEXT_80B))
    out = CliRunner().invoke(plan_command, ["--model", str(config), "--hardware", "rtx4090", "--gpu-mem", "24GiB",
                                            "--prompt-len", "32000", "--gen-len", "768"])
    assert out.exit_code == 0, out.output
    assert "36 DeltaNet layers hold 80.1 MiB of state a sequence; KV in 12 full-attention layers only" in out.output
    line = next(ln for ln in out.output.splitlines() if "sequences that fit" in ln)
    assert "all full attention" in line and "x the sequences" in line


def test_sequences_that_fit_grow_with_the_state_saved():
    spec = described(QWEN3_NEXT_80B)[1]
    hw, wl = hardware_preset("rtx4090").with_memory(gpu_mem_bytes=24 << 30), WorkloadSpec(prompt_len=8192, gen_len=64)
    cpu = TierSplit(gpu=0, cpu=1, disk=0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.05, cpu=0.15, disk=0.8), cache=cpu,
                    activations=cpu)
    ours = sequences_that_fit(policy, spec, hw, wl).sequences
    full = sequences_that_fit(policy, all_full_attention(spec), hw, wl).sequences
    assert ours > 2 * full > 0


def test_max_rss_plans_the_states_of_the_batch():
    from flexlamps.commands.memory import planned_rss_bytes

    spec = described(QWEN3_NEXT_80B)[1]
    one, nine = (planned_rss_bytes(spec, 2.0, offload_budgets=None, num_sequences=n, context_len=1)
                 for n in (1, 9))
    assert nine - one >= 8 * spec.num_layers * spec.state_bytes_per_sequence_per_layer()


def test_the_planner_prices_the_engines_delta_rule_chunk():
    """placement cannot import the engine (torch): its copy of the chunk size must agree."""
    from flexlamps.models.hybrid_config import DELTA_RULE_CHUNK
    from placement.model_spec import LINEAR_CHUNK

    assert LINEAR_CHUNK == DELTA_RULE_CHUNK


def test_the_delta_rules_work_is_priced_a_decode_token_a_whole_chunk():
    """A decode token pays its padded chunk of the chunked rule, a prompt token a chunk's share;
    the planner charges it at the profile's delta-rule rate (a hybrid's decode was priced 2.7x too
    fast without it, scripts/bench_planner_accuracy.py), and not at all on a model without
    DeltaNet layers."""
    from placement.model_spec import LINEAR_CHUNK, delta_rule_flops

    spec = described(QWEN3_NEXT_80B)[1]
    c, d = LINEAR_CHUNK, 128
    decode = 4 * c * c * d + 2 * c * c * d + 4 * c * d * d + 2 * c * c * d
    assert delta_rule_flops(c, d, d, True) == decode
    assert delta_rule_flops(c, d, d, False) == (decode + 2 * c * d * d) / c
    assert spec.delta_rule_flops_per_token_per_layer(True) == 32 * decode * 36 / 48
    assert all_full_attention(spec).delta_rule_flops_per_token_per_layer(True) == 0
    # the passes around the rule: a decode token lays out its whole open chunk, a prompt token itself
    passes = spec.delta_rule_passes_per_token_per_layer
    assert passes(True) > passes(False) > 0 == all_full_attention(spec).delta_rule_passes_per_token_per_layer(False)

    hw = hardware_preset("rtx4090").with_memory(gpu_mem_bytes=24 << 30)
    wl = WorkloadSpec(prompt_len=512, gen_len=32)
    cpu = TierSplit(gpu=0, cpu=1, disk=0)
    policy = Policy(gpu_batch_size=8, num_gpu_batches=1, weights=TierSplit(gpu=0.1, cpu=0.9, disk=0), cache=cpu,
                    activations=cpu)
    slow = dataclasses.replace(hw, gpu_delta_rule_flops_per_s={"decode": 1e9, "prompt": 1e9})
    fast = dataclasses.replace(hw, gpu_delta_rule_flops_per_s={"decode": 1e15, "prompt": 1e15})
    slow_est, fast_est = evaluate(policy, spec, slow, wl), evaluate(policy, spec, fast, wl)
    rule_decode_s = 8 * spec.delta_rule_flops_per_token_per_layer(True) / 1e9
    assert abs((slow_est.decode_s - fast_est.decode_s) / (spec.num_layers * 31) - rule_decode_s) < 1e-3 * rule_decode_s


def test_a_delta_rule_rate_survives_json_and_a_bad_phase_is_refused():
    import pytest

    hw = dataclasses.replace(hardware_preset("rtx4090"), gpu_delta_rule_flops_per_s={"decode": 2e9, "prompt": 5e9})
    back = type(hw).from_json(hw.to_json())
    assert back.gpu_delta_rule_flops_per_s == {"decode": 2e9, "prompt": 5e9}
    with pytest.raises(ValueError, match="unknown phase 'prefill'"):
        dataclasses.replace(hw, gpu_delta_rule_flops_per_s={"prefill": 1e9})
