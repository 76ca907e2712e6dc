"""`flexlamps agents` end to end on a tiny model, and the trace scaling it relies on."""

import json

import pytest
from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.workloads.tokenized import TraceScale, filler_ids, scale_spec, tokenize_requests, total_tokens
from flexlamps.sched.request import RequestSpec, Segment
from tests.conftest import SHARED_DATA

TRACE = SHARED_DATA / "augmented" / "merged_exp_uniform.json"


def test_scale_spec_caps_lengths_and_scales_time():
    spec = RequestSpec("r0-a", 900, (Segment(120, "qa", 0.5, 60), Segment(80, "qa", 2.0, 40), Segment(30)))
    small = scale_spec(spec, TraceScale(time_scale=0.1, max_prompt=40, max_segment_output=10,
                                        max_api_tokens=5, max_context=1000))
    assert small.prompt_tokens == 40
    assert [s.completion_tokens for s in small.segments] == [10, 10, 10]
    assert [s.api_tokens for s in small.segments] == [5, 5, 0]
    assert small.segments[1].api_time == pytest.approx(0.2)
    assert total_tokens(small) == 40 + 30 + 10


def test_scale_spec_ends_the_request_at_the_context_cap():
    spec = RequestSpec("r0-a", 10, tuple(Segment(20, "qa", 1.0, 20) for _ in range(10)) + (Segment(5),))
    for cap in (12, 30, 57, 100):
        small = scale_spec(spec, TraceScale(max_context=cap))
        assert total_tokens(small) < cap
        assert small.segments[-1].api_type is None
        assert all(s.completion_tokens >= 1 for s in small.segments)


def test_filler_ids_are_deterministic_per_template_and_avoid_special_tokens():
    assert filler_ids("t/prompt", 50, 10, {0, 1}) == filler_ids("t/prompt", 50, 10, {0, 1})
    assert not {0, 1} & set(filler_ids("t/prompt", 200, 10, {0, 1}))
    a, b = tokenize_requests([RequestSpec("r0-x", 5, (Segment(2, "qa", 1, 3), Segment(1))),
                              RequestSpec("r7-x", 5, (Segment(2, "qa", 1, 3), Segment(1)))], 50, set())
    assert a.prompt_ids == b.prompt_ids and a.returned_ids == b.returned_ids  # same template "x"


def _args(tiny_llama, out, *extra):
    return ["agents", "--model", str(tiny_llama), "--trace", str(TRACE), "--num-requests", "5", "--qps", "50",
            "--time-scale", "0.001", "--max-context", "80", "--max-prompt", "20", "--max-output", "5",
            "--max-api-tokens", "5", "--gpu-kv-mem", "96KiB", "--cpu-swap-mem", "24KiB", "--block-size", "4",
            "--out", str(out), *extra]


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/data/augmented is not present")
def test_agents_command_runs_policies_and_writes_results(tiny_llama, tmp_path):
    out = tmp_path / "agents"
    res = CliRunner().invoke(main, _args(tiny_llama, out, "--verify"))
    assert res.exit_code == 0, res.output
    for policy in ("lamps", "infercept", "fcfs"):
        assert any(line.startswith(policy) for line in res.output.splitlines())
        assert f"{policy} qps 50: verified, all 5 outputs equal the uninterrupted generation" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert [r["summary"]["policy"] for r in summary["results"]] == ["lamps", "infercept", "fcfs"]
    for r in summary["results"]:
        assert r["exact"] is True
        assert r["summary"]["num_requests"] == 5
        assert r["summary"]["e2e_mean"] > 0
    assert summary["cost_model"]["gpu_kv_tokens"] == 96 * 1024 // summary["cost_model"]["kv_bytes_per_token"] // 4 * 4
    assert (out / "cdf_qps50.png").stat().st_size > 0 and (out / "latency_vs_load.png").stat().st_size > 0


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/data/augmented is not present")
def test_agents_command_says_when_the_context_cannot_fit_the_pool(tiny_llama, tmp_path):
    res = CliRunner().invoke(main, _args(tiny_llama, tmp_path, "--gpu-kv-mem", "12KiB", "--no-plots"))
    assert res.exit_code != 0
    assert "--gpu-kv-mem" in res.output and "--max-context" in res.output
