"""`flexlamps generate` end to end: happy path, bad input, resume after a kill, reproducible sampling."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from flexlamps.cli import main

WORDS = ["the quick brown fox", "hello world", "numbers 1 2 3", "Once upon a time", "a tiny model", "punctuation !?"]


def _write_prompts(path, n):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"p{i}", "prompt": WORDS[i % len(WORDS)] + f" {i}", "tag": i % 3}) + "\n")
    return path


def _read(path):
    return [json.loads(ln) for ln in open(path)]


def _run(args):
    return CliRunner().invoke(main, ["generate", "--no-progress", *args], catch_exceptions=False)


def test_happy_path_keeps_extra_fields_and_order(tiny_llama, tmp_path):
    prompts = _write_prompts(tmp_path / "in.jsonl", 5)
    out = tmp_path / "out.jsonl"
    res = _run(["--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(out),
                "--max-new-tokens", "6", "--batch-size", "2"])
    assert res.exit_code == 0, res.output
    rows = _read(out)
    assert [r["id"] for r in rows] == [f"p{i}" for i in range(5)]
    assert all(r["tag"] == i % 3 for i, r in enumerate(rows))
    assert all(1 <= r["num_generated_tokens"] <= 6 and r["finish_reason"] in ("eos", "length", "stop") for r in rows)
    assert "tok/s" in res.output and "peak RSS" in res.output
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_text_file_input_and_logprobs(tiny_llama, tmp_path):
    prompts = tmp_path / "in.txt"
    prompts.write_text("hello world\n\nthe quick brown fox\n")
    out = tmp_path / "out.jsonl"
    res = _run(["--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(out),
                "--max-new-tokens", "4", "--logprobs", "--ignore-eos"])
    assert res.exit_code == 0, res.output
    rows = _read(out)
    assert [r["id"] for r in rows] == ["1", "3"]  # ids are line numbers; blank lines skipped
    assert all(len(r["logprobs"]) == 4 and all(lp <= 0 for lp in r["logprobs"]) for r in rows)


def test_malformed_jsonl_names_line_and_writes_nothing(tiny_llama, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "broken"\n')
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(out)])
    assert res.exit_code != 0
    assert "in.jsonl:2" in res.output and "malformed JSON" in res.output
    assert not out.exists() and not (tmp_path / "out.jsonl.partial").exists()


def test_missing_prompt_field_and_duplicate_ids(tiny_llama, tmp_path):
    for body, needle in [('{"id": 1, "text": "x"}\n', '"prompt"'), ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "already used")]:
        prompts = tmp_path / "in.jsonl"
        prompts.write_text(body)
        res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts),
                                        "--out", str(tmp_path / "o.jsonl")])
        assert res.exit_code != 0 and needle in res.output


@pytest.mark.parametrize("model", ["no-such-model", "/nonexistent/folder"])
def test_unknown_model_is_a_clear_error(tmp_path, model):
    prompts = _write_prompts(tmp_path / "in.jsonl", 1)
    res = CliRunner().invoke(main, ["generate", "--model", model, "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code != 0
    assert "unknown model" in res.output and "nothing is downloaded" in res.output


def test_prompt_over_context_is_rejected(tiny_llama, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"id": "long", "prompt": "hello world " * 200}) + "\n")
    res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts),
                                    "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code != 0 and "'long'" in res.output and "context is 128" in res.output


def test_sampling_is_reproducible_across_batch_sizes(tiny_llama, tmp_path):
    prompts = _write_prompts(tmp_path / "in.jsonl", 4)
    texts = []
    for bs in ("1", "4"):
        out = tmp_path / f"out{bs}.jsonl"
        res = _run(["--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(out), "--temperature", "1.0",
                    "--top-p", "0.9", "--top-k", "50", "--seed", "7", "--max-new-tokens", "8", "--batch-size", bs])
        assert res.exit_code == 0, res.output
        texts.append([r["text"] for r in _read(out)])
    assert texts[0] == texts[1]


def test_killed_run_resumes_without_loss_or_duplicates(tiny_llama, tmp_path):
    prompts = _write_prompts(tmp_path / "in.jsonl", 40)
    args = ["--model", str(tiny_llama), "--prompts", str(prompts), "--max-new-tokens", "24", "--ignore-eos",
            "--batch-size", "1", "--no-progress"]
    cmd = [sys.executable, "-m", "flexlamps.cli", "generate", *args]
    ref = tmp_path / "ref.jsonl"
    subprocess.run(cmd + ["--out", str(ref)], check=True, capture_output=True, timeout=300)

    out = tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    proc = subprocess.Popen(cmd + ["--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if partial.exists() and partial.read_text().count("\n") >= 5:
            break
        time.sleep(0.05)
    killed = proc.poll() is None
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not out.exists()
    done_before = len(_read(partial)) if partial.exists() else 0
    subprocess.run(cmd + ["--out", str(out)], check=True, capture_output=True, timeout=300)
    rows = _read(out)
    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 40
    assert {r["id"]: r["text"] for r in rows} == {r["id"]: r["text"] for r in _read(ref)}
    assert killed and done_before >= 5


def test_offloaded_generation_equals_plain(tiny_llama, tmp_path):
    prompts = _write_prompts(tmp_path / "in.jsonl", 6)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 2, "num_gpu_batches": 2, "weights": {"gpu": 0.2, "cpu": 0.3, "disk": 0.5},
        "cache": {"gpu": 0.5, "cpu": 0.5, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    common = ["--model", str(tiny_llama), "--prompts", str(prompts), "--max-new-tokens", "8", "--ignore-eos"]
    res = _run(common + ["--out", str(tmp_path / "plain.jsonl")])
    assert res.exit_code == 0, res.output
    res = _run(common + ["--out", str(tmp_path / "off.jsonl"), "--gpu-mem", "64MiB", "--cpu-mem", "64MiB",
                         "--offload-dir", str(tmp_path / "off"), "--policy", str(policy)])
    assert res.exit_code == 0, res.output
    assert "policy: block 2 x 2" in res.output and "peak gpu tier" in res.output
    assert [r["text"] for r in _read(tmp_path / "plain.jsonl")] == [r["text"] for r in _read(tmp_path / "off.jsonl")]


def test_offload_budget_too_small_is_a_clear_error(tiny_llama, tmp_path):
    prompts = _write_prompts(tmp_path / "in.jsonl", 2)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 1, "num_gpu_batches": 1, "weights": {"gpu": 1, "cpu": 0, "disk": 0},
        "cache": {"gpu": 1, "cpu": 0, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts), "--out",
                                    str(tmp_path / "o.jsonl"), "--gpu-mem", "10KiB", "--policy", str(policy)])
    assert res.exit_code != 0 and "gpu tier budget exceeded" in res.output and "short" in res.output
    assert not (tmp_path / "o.jsonl").exists()
