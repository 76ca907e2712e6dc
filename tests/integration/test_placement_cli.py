"""`flexlamps plan` and `flexlamps profile` through click's CliRunner."""

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from flexlamps.cli import main
from placement import HardwareSpec, ModelSpec, Plan, WorkloadSpec
from flexlamps.hardware.int4_probes import PROBE_ROWS
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS


def _run(*args):
    return CliRunner().invoke(main, list(args))


def test_import_placement_pulls_in_no_torch():
    code = ("import placement, flexlamps.commands.plan, sys; placement.solve; "
            "assert 'torch' not in sys.modules, 'placement or `flexlamps plan` imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_json_schema():
    result = _run("plan", "--model", "opt-30b", "--hardware", "t4-flexgen", "--prompt-len", "512",
                  "--gen-len", "32", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"model", "hardware", "workload", "plan"}
    assert ModelSpec.from_dict(out["model"]).name == "opt-30b"
    assert HardwareSpec.from_dict(out["hardware"]).name == "t4-flexgen"
    assert WorkloadSpec.from_dict(out["workload"]) == WorkloadSpec(prompt_len=512, gen_len=32)
    plan = Plan.from_dict(out["plan"])
    policy = out["plan"]["policy"]
    for key in ("gpu_batch_size", "num_gpu_batches", "weights", "cache", "activations",
                "compress_weight", "compress_cache", "cpu_attention"):
        assert key in policy
    assert set(policy["weights"]) == {"gpu", "cpu", "disk"}
    assert plan.tokens_per_s > 0 and set(plan.peak_bytes) == {"gpu", "cpu", "disk"}


def test_plan_table_and_memory_overrides(tmp_path):
    config = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1024,
              "vocab_size": 1000}
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for model_arg in (str(folder), str(folder / "config.json")):
        result = _run("plan", "--model", model_arg, "--hardware", "rtx4090", "--gpu-mem", "2GiB",
                      "--cpu-mem", "8GiB", "--prompt-len", "128", "--gen-len", "16")
        assert result.exit_code == 0, result.output
        assert "tiny-llama" in result.output and "tokens/s" in result.output
        assert "budget (GiB)" in result.output and "1.8" in result.output  # 0.9 x 2 GiB


@pytest.mark.parametrize("args, message", [
    (("--model", "gpt-9"), "neither a config.json"),
    (("--model", "opt-30b", "--hardware", "tpu-v9"), "neither a profile.json"),
    (("--model", "opt-30b", "--gpu-mem", "0"), "must be positive"),
    (("--model", "opt-30b", "--cpu-mem", "-4GiB"), "must be positive"),
    (("--model", "opt-30b", "--gpu-mem", "lots"), "cannot read the size"),
    (("--model", "opt-30b", "--prompt-len", "0"), "prompt-len"),
])
def test_plan_rejects_bad_input(args, message):
    result = _run("plan", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_plan_rejects_malformed_configs(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    unsupported = tmp_path / "gpt2.json"
    unsupported.write_text(json.dumps({"model_type": "gpt2"}))
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    for path, message in ((broken, "Expecting property name"), (missing, "config.json lacks the field"),
                          (unsupported, "not supported"), (empty_folder, "no config.json")):
        result = _run("plan", "--model", str(path))
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_plan_reports_infeasible_with_shortfall():
    result = _run("plan", "--model", "opt-175b", "--gpu-mem", "1GiB", "--cpu-mem", "1GiB",
                  "--disk-mem", "10GB")
    assert result.exit_code == 1
    assert "no placement fits: disk: needs" in result.output and "--disk-mem" in result.output


def test_profile_quick_writes_a_spec_the_planner_reads(tmp_path):
    """One quick profile on a model's own matrices (each profile takes ~70 s under load, so the
    no-`--model` run, which differs only in the shapes `probe_shapes` picks, is not repeated)."""
    out = tmp_path / "hw.json"
    result = _run("profile", "--out", str(out), "--quick", "--gpu-mem", "1GiB", "--model", "smollm2-135m")
    assert result.exit_code == 0, result.output
    spec = HardwareSpec.from_json(out.read_text())
    assert "576x576/192x576/192x576/576x576/1536x576/1536x576/576x1536" in spec.name  # the model's matrices
    assert spec.gpu_mem_bytes == 1 << 30
    assert set(spec.gpu_matmul_flops_per_s) == {"fp32", "bf16", "fp16"}
    assert spec.disk_read_bytes_per_s > 0 and spec.cpu_attention_flops_per_s > 0
    assert spec.gpu_layer_overhead_s > 0
    rates = spec.gpu_gemm_flops_by_rows["fp32"]
    assert rates["2048"] > rates["1"]  # one row streams weights; many rows reuse them
    assert list(rates.values()) == sorted(rates.values())  # noise pooled away: more rows never run slower
    if not torch.cuda.is_available():  # resident weights are prepacked on CPUs only
        assert set(spec.gpu_gemm_flops_by_rows_resident["fp32"]) == set(rates)
    assert spec.gpu_dequant_matrix_s >= 0 and spec.gpu_dequant_bytes_per_s > 0
    # the engine's 4-bit weights: the fused kernel's rates under the engine's switch, their dequantization
    assert spec.int4_dense_from_rows == INT4_DENSE_FROM_ROWS and spec.gpu_int4_dequant_bytes_per_s > 0
    assert {int(r) for r in spec.gpu_int4_gemm_flops_by_rows["bf16"]} == {r for r in PROBE_ROWS if r < INT4_DENSE_FROM_ROWS}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw.json"]  # no temp files left
    planned = _run("plan", "--model", "smollm2-135m", "--hardware", str(out), "--json")
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["hardware"]["gpu_mem_bytes"] == 1 << 30


def test_profile_rejects_bad_input(tmp_path):
    assert _run("profile", "--out", str(tmp_path / "no" / "hw.json"), "--quick").exit_code == 2
    result = _run("profile", "--out", str(tmp_path / "hw.json"), "--quick", "--gpu-mem", "-1")
    assert result.exit_code == 2 and "must be positive" in result.output
    broken = tmp_path / "bad.json"
    broken.write_text(json.dumps({"name": "x", "gpu_mem_bytes": 1}))
    result = _run("plan", "--model", "opt-30b", "--hardware", str(broken))
    assert result.exit_code == 2 and "HardwareSpec" in result.output


def test_plan_evaluates_a_given_policy(tmp_path):
    searched = _run("plan", "--model", "opt-30b", "--json")
    document = tmp_path / "plan.json"
    document.write_text(searched.output)
    policy_only = tmp_path / "policy.json"
    policy_only.write_text(json.dumps(json.loads(searched.output)["plan"]["policy"]))
    best = json.loads(searched.output)["plan"]["tokens_per_s"]
    for path in (document, policy_only):
        result = _run("plan", "--model", "opt-30b", "--policy", str(path), "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["plan"]["tokens_per_s"] == pytest.approx(best)
    squeezed = _run("plan", "--model", "opt-30b", "--policy", str(policy_only), "--gpu-mem", "4GiB")
    assert squeezed.exit_code == 0 and "exceeds the gpu budget" in squeezed.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpu_batch_size": 0}))
    result = _run("plan", "--model", "opt-30b", "--policy", str(bad))
    assert result.exit_code == 2 and "Policy" in result.output


def test_profile_keeps_the_best_of_each_thread_count(monkeypatch):
    """The GEMM table is a dict of dicts: each entry is compared on its own, at every depth."""
    import torch

    from flexlamps.hardware import machine

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    runs = iter([{"fp32": {"1": 1.0, "8": 9.0}}, {"fp32": {"1": 3.0, "8": 2.0}}])
    assert machine._best_over_threads(lambda: next(runs)) == {"fp32": {"1": 3.0, "8": 9.0}}
    runs = iter([(1.0, 5.0), (2.0, 4.0)])
    assert machine._best_over_threads(lambda: next(runs), pick=min) == (1.0, 4.0)


def test_profile_rejects_an_unknown_model(tmp_path):
    assert _run("profile", "--out", str(tmp_path / "hw.json"), "--quick", "--model", "no-such-model").exit_code == 2


def test_probe_shapes_fall_back_to_a_generic_matrix_for_big_models():
    from flexlamps.hardware import probes
    from placement import model_preset

    small = model_preset("smollm2-135m").layer_matrix_shapes()
    assert probes.probe_shapes(small, 4, 64 << 20) == tuple(small)
    big = model_preset("opt-30b").layer_matrix_shapes()  # 2.4 GB of fp32 per layer
    assert probes.probe_shapes(big, 4, 256 << 20) == probes.GENERIC_SHAPES
    assert probes.probe_shapes(None, 4, 256 << 20) == probes.GENERIC_SHAPES
    cycle = probes._matrix_cycle(small, 4, 64 << 20)
    assert sum(o * i for o, i in cycle) * 4 >= 64 << 20 and cycle[:len(small)] == small


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e15), max_size=8))
def test_nondecreasing_pools_dips_and_keeps_the_total(values):
    from flexlamps.hardware.probes import nondecreasing

    out = nondecreasing(values)
    assert len(out) == len(values)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(out, out[1:]))
    assert sum(out) == pytest.approx(sum(values), rel=1e-9)
    if values == sorted(values):
        assert out == pytest.approx(values)


def test_engine_profile_cache_is_keyed_by_the_probed_matrices(tmp_path, monkeypatch):
    """A small model gets a profile timed on its own matrices; a model too big for the quick
    probes shares the generic one (so it is not measured again per model)."""
    from flexlamps.hardware import cache
    from placement import hardware_preset, model_preset

    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    small = model_preset("smollm2-135m").layer_matrix_shapes()
    assert cache.profile_cache_path(small) != cache.profile_cache_path()
    assert cache.profile_cache_path(small) == cache.profile_cache_path(list(small))
    generic = hardware_preset("rtx4090")
    cache.profile_cache_path().write_text(generic.to_json())
    big = model_preset("llama-3-8b").layer_matrix_shapes()
    assert cache.machine_profile(tmp_path, model_shapes=big) == generic


def test_plan_keeps_to_what_the_engine_runs():
    """Issue 13's reproduction: `plan --model opt-30b` split the activations over tiers; a KV
    cache on disk runs (`caches.disk_rows`), and `--no-cache-on-disk` keeps it in memory."""
    default = json.loads(_run("plan", "--model", "opt-30b", "--json").output)["plan"]["policy"]
    assert max(default["activations"].values()) == 1 and default["activations"]["disk"] == 0
    in_memory = json.loads(_run("plan", "--model", "opt-30b", "--no-cache-on-disk", "--json").output)
    assert in_memory["plan"]["policy"]["cache"]["disk"] == 0
    one_by_one = _run("plan", "--model", "opt-30b", "--no-merged-decode", "--json")
    assert json.loads(one_by_one.output)["plan"]["policy"]["merge_decode"] is False
    assert "would not run this policy as planned" not in _run("plan", "--model", "opt-30b").output
