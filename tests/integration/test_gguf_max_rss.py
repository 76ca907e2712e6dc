"""`generate --max-rss` on a GGUF stays under its cap while the offload store is written: a tied
Q6_K table of 65536 x 2048 (a 1B head's kind, at half its size) is built a few tile rows at
a time and a piece at a time, its dense lookup table a piece at a time, and what remains of the
build is charged (`placement.cost_memory.build_transient_bytes`). Built whole, the head's file bytes,
int8 codes and scales and the whole bf16 table took the process 1174 MiB (the tiers' peaks: 392), past
this cap by 224 MiB; now 743."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
random_gguf = importlib.import_module("random_gguf")
MiB = 1 << 20

# runs argv[1:] and prints its peak RSS (KiB) last: a launcher of its own, so the peak is the child's alone
_LAUNCHER = ("import resource, subprocess, sys\n"
             "code = subprocess.run(sys.argv[1:]).returncode\n"
             "print(f'peak-rss-kib {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}')\n"
             "sys.exit(code)\n")


@pytest.fixture(scope="module")
def big_table_gguf(tmp_path_factory) -> Path:
    shape = random_gguf.Shape("llama", hidden=2048, ffn=1024, layers=1, heads=8, kv_heads=2, vocab=65536)
    types = lambda name: "Q6_K" if name.startswith("token_embd") else "Q4_K"  # noqa: E731 (Q4_K_M's table)
    return random_gguf.write_random_gguf(tmp_path_factory.mktemp("gguf") / "table.gguf", shape, types=types,
                                         values=random_gguf.SMALL_NORMAL)


def test_generate_under_max_rss_stays_under_it_while_the_store_is_written(big_table_gguf, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": f"t{i} t3"}) + "\n" for i in range(2)))
    # no machine profile measured: half the weights each memory tier (each tier's peak ~200 MiB, the cap
    # leaving the cpu tier 212 MiB)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 2, "num_gpu_batches": 1, "weights": {"gpu": 0.5, "cpu": 0.5, "disk": 0},
        "cache": {"gpu": 0, "cpu": 1, "disk": 0}, "activations": {"gpu": 0, "cpu": 1, "disk": 0}}))
    cap = 950 * MiB
    cmd = [sys.executable, "-m", "flexlamps", "generate", "--model", str(big_table_gguf), "--prompts", str(prompts),
           "--out", str(tmp_path / "out.jsonl"), "--max-new-tokens", "2", "--gpu-mem", "208MiB",
           "--max-rss", str(cap), "--policy", str(policy), "--offload-dir", str(tmp_path / "off"), "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *cmd], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    peak = int(res.stdout.strip().splitlines()[-1].split()[1]) * 1024
    assert peak <= cap, f"peak RSS {peak / MiB:.0f} MiB over --max-rss {cap / MiB:.0f} MiB: {res.stderr[-600:]}"
