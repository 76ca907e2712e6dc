"""Placement does not change a record (`docs/generate.md`), so a record's fingerprint leaves it
out: `generate` in memory and offloaded under a policy file (weights over the gpu, cpu and disk
tiers) write the same file byte for byte, and a run killed in memory is resumed offloaded with
its records kept; what does change the bits (a policy's compression) is still refused."""

import os
import signal
import subprocess
import sys

import pytest

from flexlamps.fault_points import kill_at
from placement import Policy, TierSplit
from tests.checkpoint_zoo import CheckpointZoo

PROMPTS = [f"the quick brown fox {' jumps' * i} over" for i in range(8)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return CheckpointZoo(tmp_path_factory.mktemp("fp_zoo")).path("gguf:llama:Q4_0")


def _generate(model, prompts, out, *extra, env=None):
    cmd = [sys.executable, "-m", "flexlamps", "generate", "--no-progress", "--model", str(model), "--prompts",
           str(prompts), "--out", str(out), "--max-new-tokens", "5", "--ignore-eos", "--threads", "1", "--logprobs",
           "--batch-size", "3", *extra]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)


def _policy(path, compress: bool = False):
    split = TierSplit(gpu=0.2, cpu=0.3, disk=0.5)
    on_gpu = TierSplit(gpu=1, cpu=0, disk=0)
    path.write_text(Policy(gpu_batch_size=3, num_gpu_batches=1, weights=split, cache=on_gpu, activations=on_gpu,
                           compress_weight=compress).to_json())
    return path


@pytest.mark.slow
@pytest.mark.ci
def test_placement_leaves_the_file_and_its_resume_alone(model, tmp_path):
    import json

    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    offloaded = ("--gpu-mem", "64MiB", "--cpu-mem", "64MiB", "--offload-dir", str(tmp_path / "off"),
                 "--policy", str(_policy(tmp_path / "policy.json")))
    mem, off = tmp_path / "mem.jsonl", tmp_path / "off.jsonl"
    assert _generate(model, prompts, mem).returncode == 0
    done = _generate(model, prompts, off, *offloaded)
    assert done.returncode == 0, done.stderr[-2000:]
    assert off.read_bytes() == mem.read_bytes()
    resumed = tmp_path / "resumed.jsonl"  # killed in memory after 4 records, finished offloaded
    killed = _generate(model, prompts, resumed, env=kill_at("record", 4))
    assert killed.returncode == -signal.SIGKILL
    done = _generate(model, prompts, resumed, *offloaded)
    assert done.returncode == 0 and "recomputing" not in done.stderr, done.stderr[-2000:]
    assert resumed.read_bytes() == mem.read_bytes()
    compressed = ("--gpu-mem", "64MiB", "--cpu-mem", "64MiB", "--offload-dir", str(tmp_path / "off2"),
                  "--policy", str(_policy(tmp_path / "compressed.json", compress=True)))
    refused = _generate(model, prompts, resumed, *compressed)
    assert refused.returncode != 0 and "other options" in refused.stderr
