"""Sliding-window layers in the planner: `ModelSpec.layer_windows` from each family's config, the
cache a window layer holds (its window, not the context) and what `flexlamps plan` gives for it."""

import json

import pytest
import transformers
from click.testing import CliRunner

from flexlamps.cli import main
from tests.described import described, plan_target
from placement import ModelSpec, WorkloadSpec, evaluate, hardware_preset, solve

# Mistral-7B-v0.1's config.json (sliding_window 4096)
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 4096}


def _hf(model_type: str, **fields) -> dict:
    small = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=128)
    return transformers.AutoConfig.for_model(model_type, **{**small, **fields}).to_dict()


@pytest.mark.parametrize("model_type, fields, windows", [
    ("mistral", dict(num_hidden_layers=3, sliding_window=8), (8, 8, 8)),
    ("mistral", dict(num_hidden_layers=3, sliding_window=None), ()),
    ("gemma2", dict(num_hidden_layers=4, sliding_window=6), (6, 0, 6, 0)),
    ("gemma3_text", dict(num_hidden_layers=6, sliding_window=5), (5, 5, 5, 5, 5, 0)),
    ("gpt_oss", dict(num_hidden_layers=4, sliding_window=16, num_local_experts=4, num_experts_per_tok=2),
     (16, 0, 16, 0)),
    ("qwen2", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=5, max_window_layers=1), (0, 5, 5)),
])
def test_model_spec_has_each_layers_window(model_type, fields, windows):
    spec = described(_hf(model_type, **fields))[1]
    assert spec.layer_windows == windows
    assert ModelSpec.from_json(spec.to_json()) == spec  # a list in JSON, a tuple again


def test_a_window_layer_holds_its_window_not_the_context():
    spec = described(_hf("gemma2", num_hidden_layers=4, sliding_window=6))[1]
    assert spec.held_tokens(4) == 4  # shorter than the window: the context, every layer
    assert spec.held_tokens(100) == (6 + 100 + 6 + 100) / 4
    assert spec.mean_attended_entries(100) == spec.held_tokens(100)
    assert spec.attended_entries(100) == 100  # the widest layer reads the whole context
    with pytest.raises(ValueError, match="layer_windows must hold one integer"):
        ModelSpec(**{**spec.to_dict(), "layer_windows": (6, 0)})


def test_planner_charges_the_window_and_gives_the_memory_to_the_batch():
    """Mistral-7B-v0.1 at 32K context on a 24 GiB GPU: its 4096-token windows hold an eighth of the
    cache a full-attention twin holds, so the same policy fits in less memory and `solve` finds a
    larger batch."""
    windowed = described(MISTRAL_7B_V01)[1]
    full = described({**MISTRAL_7B_V01, "sliding_window": None})[1]
    hardware, workload = hardware_preset("rtx4090"), WorkloadSpec(prompt_len=32000, gen_len=768)
    plan_full = solve(full, hardware, workload)
    in_window = evaluate(plan_full.policy, windowed, hardware, workload)
    assert in_window.peak_bytes["gpu"] < plan_full.peak_bytes["gpu"]
    plan_window = solve(windowed, hardware, workload)
    block = {name: p.policy.gpu_batch_size * p.policy.num_gpu_batches
             for name, p in (("window", plan_window), ("full", plan_full))}
    print(f"Mistral-7B-v0.1 shape, rtx4090, 32000 + 768 tokens: block {block['window']} with its window, "
          f"{block['full']} without")
    assert block["window"] > block["full"]


def test_plan_command_gives_the_windowed_model_a_larger_batch(tmp_path):
    blocks = {}
    for name, window in (("window", 4096), ("full", None)):
        folder = tmp_path / f"mistral-{name}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**MISTRAL_7B_V01, "sliding_window": window}))
        result = CliRunner().invoke(main, ["plan", "--model", str(folder), "--hardware", "rtx4090",
                                           "--prompt-len", "32000", "--gen-len", "768", "--json"])
        assert result.exit_code == 0, result.output
        policy = json.loads(result.output)["plan"]["policy"]
        blocks[name] = policy["gpu_batch_size"] * policy["num_gpu_batches"]
    print(f"flexlamps plan, Mistral-7B-v0.1 shape at 32K: block {blocks['window']} with its window, "
          f"{blocks['full']} without")
    assert blocks["window"] > blocks["full"]
    table = CliRunner().invoke(main, ["plan", "--model", str(tmp_path / "mistral-window"), "--hardware", "rtx4090",
                                      "--prompt-len", "32000", "--gen-len", "768"])
    assert "windows   32 of 32 layers slide and keep their last 4096 positions: a sequence's cache at 32768 " \
           "tokens is 12.5% of the whole context's" in table.output, table.output


def test_dry_run_charges_a_window_layer_its_ring():
    """The executor's dry run at 32K: the Mistral-7B-v0.1 shape's cache on the cpu tier takes
    4096 positions a layer where its full-attention twin takes the context; nothing else moves."""
    import torch

    from flexlamps.planning.dry_run import dry_run
    from flexlamps.planning.target import BlockLengths
    from placement import Policy, TierSplit

    on_cpu = TierSplit(gpu=0, cpu=1, disk=0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=on_cpu, cache=on_cpu, activations=on_cpu)
    lengths = BlockLengths(prompt_len=32000, gen_len=768)
    peaks = {window: dry_run(plan_target({**MISTRAL_7B_V01, "sliding_window": window}, torch.bfloat16), policy,
                             lengths, gpu_mem=1 << 40, cpu_mem=1 << 40).peak_bytes["cpu"]
             for window in (4096, None)}
    per_position = 32 * 2 * 2 * 8 * 128 * 2  # layers x rows x (K, V) x kv heads x head dim x bf16
    assert peaks[None] - peaks[4096] == per_position * (32000 + 768 - 4096)
