"""`flexlamps generate` in bfloat16 writes the same file whatever the batching: `--batch-size`
1 / 7 / 32, offloaded, resumed after a kill, on two Ray workers (docs/generate.md, "The same
answer in any batch"). A tiny random model, dense bf16 and Q4_0 blocks computed in place."""

import json
import os
import signal
import subprocess
import sys

import pytest

from flexlamps.fault_points import kill_at
from tests.checkpoint_zoo import CheckpointZoo

WORDS = "the quick brown fox jumps over a lazy dog while numbers 1 2 3 count".split()
NUM_PROMPTS = 12


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("inv_prompts") / "in.jsonl"
    with open(path, "w") as fh:
        for i in range(NUM_PROMPTS):  # 1 to 34 words: prompts of mixed lengths
            words = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + (i * 11) % 34)]
            fh.write(json.dumps({"id": f"p{i}", "prompt": " ".join(words)}) + "\n")
    return path


@pytest.fixture(scope="module")
def models(tiny_llama, tmp_path_factory):
    zoo = CheckpointZoo(tmp_path_factory.mktemp("inv_zoo"))
    return {"dense": (tiny_llama, "bfloat16"), "Q4_0": (zoo.path("gguf:llama:Q4_0"), "auto")}


def _generate(model, dtype, prompts, out, *extra, env=None, check=True):
    cmd = [sys.executable, "-m", "flexlamps", "generate", "--no-progress", "--model", str(model), "--dtype", dtype,
           "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "6", "--ignore-eos", "--threads", "1",
           "--logprobs", *extra]
    done = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("kind", ["dense", "Q4_0"])
def test_batch_size_does_not_change_the_file(models, prompts, tmp_path, kind):
    model, dtype = models[kind]
    files = []
    for batch in ("1", "7", "32"):
        files.append(tmp_path / f"b{batch}.jsonl")
        _generate(model, dtype, prompts, files[-1], "--batch-size", batch)
    assert files[0].read_bytes() == files[1].read_bytes() == files[2].read_bytes()


@pytest.mark.slow
@pytest.mark.ci
def test_offloaded_sampled_and_resumed_runs_write_the_same_file(models, prompts, tmp_path):
    model, dtype = models["dense"]
    sampled = ("--temperature", "0.8", "--seed", "7")
    ref = tmp_path / "ref.jsonl"
    _generate(model, dtype, prompts, ref, "--batch-size", "1", *sampled)
    off = tmp_path / "off.jsonl"
    _generate(model, dtype, prompts, off, "--batch-size", "32", *sampled, "--gpu-mem", "8MiB", "--cpu-mem", "64MiB",
              "--offload-dir", str(tmp_path / "offload"))
    assert off.read_bytes() == ref.read_bytes()
    out = tmp_path / "resumed.jsonl"  # killed (SIGKILL) once its 5th record is synced, then run again
    killed = _generate(model, dtype, prompts, out, "--batch-size", "7", *sampled, env=kill_at("record", 5), check=False)
    assert killed.returncode == -signal.SIGKILL and not out.exists()
    _generate(model, dtype, prompts, out, "--batch-size", "7", *sampled)
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.slow
@pytest.mark.ci
def test_two_ray_workers_write_the_single_process_file(models, prompts, tmp_path):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'flexlamps[ray]'")
    model, dtype = models["Q4_0"]
    ref, sharded = tmp_path / "ref.jsonl", tmp_path / "ray.jsonl"
    _generate(model, dtype, prompts, ref, "--batch-size", "1")
    _generate(model, dtype, prompts, sharded, "--batch-size", "3", "--ray", "--ray-workers", "2")
    assert sharded.read_bytes() == ref.read_bytes()
