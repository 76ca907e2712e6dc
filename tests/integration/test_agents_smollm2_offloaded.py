"""The README's offloaded `flexlamps agents` line on SmolLM2: a 24-request scaled trace under
lamps, infercept and fcfs with the weights spread over gpu / cpu / disk inside 64 MiB + 256 MiB.
Every output equals its uninterrupted generation (float32), each tier's peak stays within its
budget, and the bytes swapped to the cpu tier are reported. About 15 minutes on one thread."""

import json

import pytest

from tests.conftest import SHARED_DATA

MiB = 2**20
TRACE = SHARED_DATA / "augmented" / "merged_exp_uniform.json"
POLICIES = ("lamps", "infercept", "fcfs")


@pytest.mark.slow
def test_readme_offloaded_agents_line_is_exact_within_budgets(smollm2_path, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from flexlamps.cli import main

    if not TRACE.exists():
        pytest.skip("../shared/data/augmented is not present")
    monkeypatch.chdir(tmp_path)  # the README's relative --offload-dir and --out
    args = ("agents --model smollm2-135m --trace {} --num-requests 24 --max-context 96 --max-prompt 32 --max-output 8 "
            "--max-api-tokens 8 --dtype float32 --gpu-mem 64MiB --cpu-mem 256MiB --offload-dir agents-offload "
            "--placement auto --verify --out agents-off").format(TRACE).split()
    res = CliRunner().invoke(main, [*args, "--schedulers", ",".join(POLICIES), "--no-plots"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "agents-off" / "summary.json").read_text())
    assert summary["placement"]["weights"]["gpu"] < 1  # the weights really are offloaded
    rows = {row["summary"]["policy"]: row for row in summary["results"]}
    assert sorted(rows) == sorted(POLICIES)
    for policy, row in rows.items():
        assert row["exact"] is True, (policy, row["mismatched"])
        assert len(row["records"]) == 24
        assert set(row["tier_use"]) == {"gpu", "cpu"}
        for tier, use in row["tier_use"].items():
            assert 0 < use["peak_bytes"] <= use["capacity_bytes"] == {"gpu": 64, "cpu": 256}[tier] * MiB, (policy, tier)
        assert row["swapped_out_bytes"] >= 0
        assert f"{policy} qps 0.5: peak gpu" in res.output and "to the cpu tier" in res.output
