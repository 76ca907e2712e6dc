"""Under a memory cap (`--max-rss`), the cpu tier is what the cap leaves after the engine's fixed
overhead (and the gpu tier where it is host memory): `flexlamps plan` prints that number and
plans with it; `generate` takes it as the cpu tier when --cpu-mem is not given."""

import json

import click
import pytest
from click.testing import CliRunner

from flexlamps.catalog import describe_model
from flexlamps.commands.memory import FIXED_OVERHEAD_BYTES, cpu_mem_within, fill_cap
from flexlamps.commands.plan import command as plan_command
from flexlamps.settings import RunSettings
from placement.cost_memory import build_transient_bytes

MiB = 1 << 20
MIXTRAL = dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
               vocab_size=32000, torch_dtype="bfloat16")


def test_the_cap_less_the_overhead_and_a_host_gpu_tier_is_the_cpu_tier():
    assert cpu_mem_within(4096 * MiB, 1024 * MiB, gpu_is_host=True) == 3072 * MiB - FIXED_OVERHEAD_BYTES
    assert cpu_mem_within(4096 * MiB, 1024 * MiB, gpu_is_host=False) == 4096 * MiB - FIXED_OVERHEAD_BYTES
    model = describe_model("llama-2-7b")
    assert cpu_mem_within(4096 * MiB, 1024 * MiB, False, model) == (
        4096 * MiB - FIXED_OVERHEAD_BYTES - build_transient_bytes(model, offloaded=True))


def test_generate_fills_the_cpu_tier_from_the_cap_only_where_it_is_not_given():
    run = RunSettings(gpu_mem=512 * MiB)
    filled, line = fill_cap(run, 2048 * MiB, gpu_is_host=True)
    transient = build_transient_bytes(describe_model(run.model), offloaded=True)  # SmolLM2's: 48 + 9 MiB
    assert filled.cpu_mem == 1536 * MiB - FIXED_OVERHEAD_BYTES - transient and "--max-rss 2048 MiB" in line
    assert f"the build's transients ({transient / MiB:.0f} MiB)" in line
    given = RunSettings(gpu_mem=512 * MiB, cpu_mem=100 * MiB)
    assert fill_cap(given, 2048 * MiB, gpu_is_host=True) == (given, None)
    with pytest.raises(click.ClickException, match="leaves no cpu tier"):
        fill_cap(run, 900 * MiB, gpu_is_host=True)


def test_plan_prints_the_cpu_tier_a_cap_leaves_and_plans_with_it(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MIXTRAL))
    common = ["--model", str(config), "--hardware", "rtx4090", "--gpu-mem", "8GiB", "--json", "--no-compress",
              "--no-cpu-attention"]
    out = CliRunner().invoke(plan_command, [*common, "--max-rss", "40GiB"])
    assert out.exit_code == 0, out.output
    transient = build_transient_bytes(describe_model(str(config)), offloaded=True)
    expected = 40 * 1024 * MiB - FIXED_OVERHEAD_BYTES - transient  # a GPU machine: its memory is not the process's
    assert f"--cpu-mem {expected}" in out.stderr
    plan = json.loads(out.stdout)
    assert plan["hardware"]["cpu_mem_bytes"] == expected
    explicit = CliRunner().invoke(plan_command, [*common, "--max-rss", "40GiB", "--cpu-mem", "1GiB"])
    assert json.loads(explicit.stdout)["hardware"]["cpu_mem_bytes"] == 1 << 30 and not explicit.stderr


def test_the_build_transient_is_one_part_in_memory_and_the_largest_piece_offloaded():
    """What building the weights holds beyond what is kept: a part of a matrix's form (2 Mi weights at
    24 bytes) and, offloaded, the largest matrix or table piece built at once (a 1B's: 8192 x 2048 bf16)."""
    model = describe_model("llama-2-7b")  # hidden 4096, ffn 11008: a part of 64 rows of 11008 is 704 Ki weights
    assert build_transient_bytes(model, offloaded=False) == 48 * MiB
    assert build_transient_bytes(model, offloaded=True) == 48 * MiB + 4096 * 11008 * model.dtype_bytes
