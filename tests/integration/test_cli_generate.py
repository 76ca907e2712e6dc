"""`flexlamps generate` end to end: happy path, bad input, resume after a kill, reproducible sampling."""

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.fault_points import kill_at

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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no lock files left


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
    assert "Add --chat" in res.output  # the tiny model has a chat template and no --chat was given


def test_malformed_jsonl_names_line_and_writes_nothing(tiny_llama, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "broken"\n')
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(out)])
    assert res.exit_code != 0
    assert "in.jsonl:2" in res.output and "not valid JSON" in res.output
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


def test_prompt_over_context_is_recorded_as_error_or_refused_with_strict(tiny_llama, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"id": "long", "prompt": "hello world " * 200}) + "\n"
                       + json.dumps({"id": "ok", "prompt": "hello world"}) + "\n")
    args = ["generate", "--model", str(tiny_llama), "--prompts", str(prompts), "--max-new-tokens", "3"]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "s.jsonl"), "--strict"])
    assert res.exit_code != 0 and "'long'" in res.output and "context is 128" in res.output
    assert not (tmp_path / "s.jsonl").exists()
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 0, res.output
    long, ok = _read(tmp_path / "o.jsonl")
    assert long["finish_reason"] == "error" and "context is 128" in long["error"] and long["text"] == ""
    assert ok["finish_reason"] != "error" and ok["num_generated_tokens"] >= 1


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
    prompts = _write_prompts(tmp_path / "in.jsonl", 12)
    args = ["--model", str(tiny_llama), "--prompts", str(prompts), "--max-new-tokens", "8", "--ignore-eos",
            "--batch-size", "1", "--no-progress"]
    cmd = [sys.executable, "-m", "flexlamps.cli", "generate", *args]
    ref = tmp_path / "ref.jsonl"
    subprocess.run(cmd + ["--out", str(ref)], check=True, capture_output=True, timeout=300)

    # killed (SIGKILL) once its 5th record is synced: at that point, not after a delay the load decides
    out = tmp_path / "out.jsonl"
    partial = tmp_path / "out.jsonl.partial"
    killed = subprocess.run(cmd + ["--out", str(out)], env={**os.environ, **kill_at("record", 5)},
                            capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL and not out.exists()
    assert partial.read_text().count("\n") == 5
    subprocess.run(cmd + ["--out", str(out)], check=True, capture_output=True, timeout=300)
    rows = _read(out)
    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 12
    assert {r["id"]: r["text"] for r in rows} == {r["id"]: r["text"] for r in _read(ref)}


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
    assert not list(tmp_path.rglob("*.lock*"))  # the out file's and the offload folder's locks are gone
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


def test_rerun_with_other_prompt_text_is_refused_then_recomputed_with_overwrite(tiny_llama, tmp_path):
    prompts = tmp_path / "in.txt"
    prompts.write_text("hello world\nthe quick brown fox\n")
    args = ["--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl"),
            "--max-new-tokens", "3"]
    assert _run(args).exit_code == 0
    first = _read(tmp_path / "o.jsonl")
    prompts.write_text("hello world\nnumbers 1 2 3\n")  # same ids (line numbers), other text on line 2
    res = CliRunner().invoke(main, ["generate", "--no-progress", *args])
    assert res.exit_code != 0 and "1 made with other prompt text" in res.output and "--overwrite" in res.output
    assert _read(tmp_path / "o.jsonl") == first  # refused, not overwritten
    res = _run([*args, "--overwrite"])
    assert res.exit_code == 0 and "recomputing 1 finished records: 1 made with other prompt text" in res.output
    again = _read(tmp_path / "o.jsonl")
    assert again[0] == first[0] and again[1]["fingerprint"] != first[1]["fingerprint"]
    res = _run([*args, "--temperature", "0.5"])
    assert res.exit_code != 0 and "2 made with other options" in res.output


def test_offload_dir_keeps_the_users_files(tiny_llama, tmp_path):
    prompts = _write_prompts(tmp_path / "in.jsonl", 2)
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "mydata.dat").write_text("x")
    for disk in (0.5, 0.6):  # the second split makes the folder stale: rebuilt
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({
            "gpu_batch_size": 2, "num_gpu_batches": 1, "weights": {"gpu": 1 - disk, "cpu": 0, "disk": disk},
            "cache": {"gpu": 1, "cpu": 0, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
        res = _run(["--model", str(tiny_llama), "--prompts", str(prompts), "--out", str(tmp_path / f"{disk}.jsonl"),
                    "--max-new-tokens", "2", "--gpu-mem", "64MiB", "--cpu-mem", "64MiB", "--offload-dir", str(folder),
                    "--policy", str(policy)])
        assert res.exit_code == 0, res.output
    assert (folder / "mydata.dat").read_text() == "x"
    assert sorted(p.name for p in folder.iterdir()) == ["flexlamps-offload", "mydata.dat"]


@pytest.mark.parametrize("args, needle", [
    (["--offload-dir", "PROMPTS/x"], "--offload-dir"),
    (["--out", "PROMPTS/o.jsonl"], "--out"),
    (["--top-p", "0"], "--top-p"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--gpu-mem", "lots"], "--gpu-mem"),
    (["--policy", "missing.json"], "policy file missing.json does not exist"),
    (["--prompts", "PROMPTS/x.jsonl"], "--prompts"),
    (["--offload-dir", "/proc/flexlamps-test"], "--offload-dir"),
])
def test_bad_options_are_named_before_the_model_loads(tmp_path, monkeypatch, args, needle):
    import flexlamps.api

    prompts = _write_prompts(tmp_path / "in.jsonl", 1)
    monkeypatch.setattr(flexlamps.api, "LLM", lambda *a, **k: pytest.fail("the model was loaded"))
    args = [a.replace("PROMPTS", str(prompts)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o.jsonl")]
    if "--prompts" not in args:
        args += ["--prompts", str(prompts)]
    res = CliRunner().invoke(main, ["generate", *args])
    assert res.exit_code != 0 and needle in res.output, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # a message, not a traceback


@pytest.mark.parametrize("budgets", [["--gpu-mem", "256MiB", "--cpu-mem", "256MiB"], []])
def test_max_rss_is_refused_upfront(tiny_llama, tmp_path, monkeypatch, budgets):
    """Before any weight is read, from the run's one description (a single ModelSpec built)."""
    import flexlamps.api
    import flexlamps.models.description as description
    import flexlamps.models.loading.checkpoint as checkpoint

    built, real = [], flexlamps.api.model_spec
    monkeypatch.setattr(flexlamps.api, "model_spec", lambda *a, **k: built.append(1) or real(*a, **k))
    monkeypatch.setattr(description, "model_spec", lambda *a, **k: pytest.fail("a second ModelSpec"))
    monkeypatch.setattr(checkpoint.HFFolderReader, "read", lambda *a, **k: pytest.fail("a weight was read"))
    prompts = _write_prompts(tmp_path / "in.jsonl", 1)
    res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts), "--out",
                                    str(tmp_path / "o.jsonl"), *budgets, "--max-rss", "300MiB"])
    assert res.exit_code != 0 and "--max-rss 300 MiB cannot be met" in res.output and "fixed overhead" in res.output
    assert built == [1], res.output


def test_max_rss_plans_the_cache_in_the_dtype_it_is_held(tiny_llama):
    """A bf16 run's dense cache holds bf16 keys and values: half an fp32 run's cache bytes; fp16
    on the CPU is held in fp32 (engine.caches.dense.held_dtype)."""
    from click import ClickException

    from flexlamps.commands.memory import check_max_rss, planned_rss_bytes
    from flexlamps.models.description import model_spec
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.generate_job import GenerateSettings
    from flexlamps.settings import RunSettings

    reader = open_checkpoint(str(tiny_llama))
    cfg, spec = reader.config, model_spec(reader.config)
    plan = lambda per_value: planned_rss_bytes(spec, 4.0, offload_budgets=None, num_sequences=64,  # noqa: E731
                                               context_len=512, cache_bytes_per_value=per_value)
    values = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 512 * 64
    assert plan(4) - plan(2) == 2 * values
    for dtype, cache_bytes in (("bfloat16", 2), ("float32", 4), ("float16", 4)):
        settings = GenerateSettings(run=RunSettings(model=str(tiny_llama), dtype=dtype, max_batch_size=64),
                                    max_new_tokens=0)
        weights = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}[dtype]
        just_enough = planned_rss_bytes(spec, weights, offload_budgets=None, num_sequences=64,
                                        context_len=min(open_checkpoint(str(tiny_llama)).config.max_position, 512),
                                        cache_bytes_per_value=cache_bytes)
        check_max_rss(settings, just_enough, 64, reader, spec)
        with pytest.raises(ClickException, match="cannot be met"):
            check_max_rss(settings, just_enough - 1, 64, reader, spec)
