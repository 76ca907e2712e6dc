"""`flexlamps profile --model` on a sparse-attention MLA model measures its latent pools' miss
curves through the engine's own pools, and `flexlamps plan` uses them instead of ESS's."""

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

import placement

from flexlamps.cli import main
from flexlamps.engine.latent_profile import measure_latent_miss_curves


def test_measured_curves_fall_with_the_pool(deepseek_models, tmp_path):
    curves = measure_latent_miss_curves(deepseek_models["deepseek_v32"], prompt_len=96, decode_steps=16)
    assert len(curves.miss_fractions) == 3 and curves.pool_fractions[-1] == 1.0
    assert curves.pool_fractions[0] * 112 >= 8  # never below one step's top-k
    misses = np.array(curves.miss_fractions)
    assert (np.diff(misses, axis=1) <= 1e-12).all()  # a bigger LRU pool never misses more
    assert misses[:, 0].min() > misses[:, -1].max()  # and the smallest misses clearly more
    again = measure_latent_miss_curves(deepseek_models["deepseek_v32"], prompt_len=96, decode_steps=16)
    assert again == curves  # seeded prompts: the same profile twice
    # a profile holding them: plan reads them instead of ESS's
    hw = dataclasses.replace(placement.hardware_preset("a100-80gb"), latent_miss_curves=curves)
    path, policy = tmp_path / "hw.json", tmp_path / "policy.json"
    path.write_text(hw.to_json())
    policy.write_text(json.dumps({
        "gpu_batch_size": 8, "num_gpu_batches": 1, "weights": {"gpu": 1, "cpu": 0, "disk": 0},
        "cache": {"gpu": 0.5, "cpu": 0.5, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    res = CliRunner().invoke(main, ["plan", "--model", str(deepseek_models["deepseek_v32"]), "--hardware",
                                    str(path), "--policy", str(policy), "--prompt-len", "200", "--gen-len", "24"])
    assert res.exit_code == 0, res.output
    assert f"miss curves: {curves.source}" in res.output and "latent pools" in res.output


@pytest.mark.slow
def test_profile_stores_the_curves_and_plan_uses_them(deepseek_models, tmp_path):
    folder = str(deepseek_models["deepseek_v32"])
    out = tmp_path / "hw.json"
    res = CliRunner().invoke(main, ["profile", "--quick", "--threads", "1", "--model", folder, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "latent misses (fraction of top-k, mean over layers) by pool size" in res.output
    stored = json.loads(out.read_text())["latent_miss_curves"]
    assert len(stored["miss_fractions"]) == 3 and stored["source"].startswith("measured on")
    res = CliRunner().invoke(main, ["plan", "--model", folder, "--hardware", str(out), "--gpu-mem", "4MiB",
                                    "--prompt-len", "200", "--gen-len", "24"])
    assert res.exit_code == 0, res.output
    assert "miss curves: measured on" in res.output and "latent pools" in res.output
