import json

from click.testing import CliRunner

from flexlamps.cli import main


def _trace(tmp_path):
    trace = {}
    for i in range(12):
        trace[f"m{i}"] = [
            {"prompt_tokens": 50 + 10 * i, "completion_tokens": 8 + i, "api_time": 1e-4, "api_token_length": 4},
            {"prompt_tokens": 62 + 11 * i, "completion_tokens": 5},
        ]
        trace[f"c{i}"] = [{"prompt": "tell me a story " * (i + 1), "completion": "once upon a time",
                           "api_token": "continue", "api_time": 2.0},
                          {"prompt": "x", "completion": "the end"}]
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(trace))
    return str(p)


def test_simulate_prints_table_and_writes_summary_and_plots(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["simulate", "--trace", _trace(tmp_path), "--policies", "lamps,fcfs",
                                    "--qps", "1,2", "--window", "10", "--token-budget", "256",
                                    "--swap-gib", "1", "--starvation-threshold", "50", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "E2E mean" in res.output and "lamps" in res.output and "fcfs" in res.output
    assert "budget 256 tokens" in res.output and "achieved" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["results"]) == 4
    assert summary["scheduler"]["max_num_batched_tokens"] == 256
    assert {r["policy"] for r in summary["results"]} == {"lamps", "fcfs"}
    for r in summary["results"]:  # the measured requests: warm-up and cool-down excluded
        assert 0.5 * 4 * r["qps"] * 10 < r["measured"] < 0.85 * 4 * r["qps"] * 10
        assert isinstance(r["stable"], bool) and r["achieved_rps"] > 0
    assert (out / "latency_vs_load.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_sweep_marks_saturation(tmp_path):
    out = tmp_path / "out"
    # a 32-token budget: the box saturates between 2 and 30 req/s
    res = CliRunner().invoke(main, ["simulate", "--trace", _trace(tmp_path), "--policies", "infercept",
                                    "--qps", "2,30", "--window", "15", "--token-budget", "32",
                                    "--sweep", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    sat = summary["saturation"]["infercept"]
    assert 2 <= sat < 30 and "saturates above" in res.output
    by_load = {r["qps"]: r["stable"] for r in summary["results"]}
    assert by_load[2] and not by_load[30] and len(by_load) == 5  # the grid, then 3 bisections
    assert (out / "latency_vs_load.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_rejects_bad_inputs_with_the_fix(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["simulate", "--trace", _trace(tmp_path), "--policies", "lamps,nope",
                               "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "nope" in res.output and "infercept" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"r1": [{"prompt_tokens": 3}]}')
    res = runner.invoke(main, ["simulate", "--trace", str(bad), "--out", str(tmp_path / "o"), "--no-plots"])
    assert res.exit_code != 0 and "r1" in res.output and "bad.json" in res.output
