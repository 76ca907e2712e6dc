"""Fault injection: kill -9 at every stage of a run, a full disk, concurrent runs, damaged partial files.

A kill comes at a named point the run reaches (`flexlamps.fault_points`: --out locked, a weight
stored in the offload folder, a record synced, the output written), never after a sleep, so
where a run dies cannot depend on the machine's load. After each fault, rerunning the same
command must give exactly the uninterrupted result (0 lost, 0 duplicated, 0 stale records) and
no user file may be touched. One point of each kill runs in the quick suite (helm's, and the
concurrent runs, in CI's `-m ci` leg); `-m "faults and slow"` runs every point, 20 seeds of the
offload folder's writes and two concurrent runs.
"""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.fault_points import kill_at
from flexlamps.io.results import _with_check

pytestmark = pytest.mark.faults

NUM_PROMPTS = 12
SEEDS_QUICK = [0]
SEEDS_ALL = list(range(20))
# where generate is killed (point, pass): from startup through loading, writing, finishing
GENERATE_KILLS = [("job_locked", 1), ("weight_stored", 1), ("weight_stored", 12), ("record", 1), ("record", 6),
                  ("record", NUM_PROMPTS), ("finalized", 1)]
GENERATE_KILL_QUICK = ("record", 6)
# helm's demo run: 8 requests, 4 batches of 2, then the run folder
HELM_KILLS = [("helm_progress", 1), ("helm_progress", 3), ("helm_run_written", 1)]


@pytest.fixture(scope="module")
def job(tiny_llama, tmp_path_factory):
    """The prompt file, the generate arguments (offloaded, with a disk share) and the
    uninterrupted reference output."""
    root = tmp_path_factory.mktemp("faults")
    prompts = root / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{k}", "prompt": f"hello world {k}", "tag": k}) + "\n"
                               for k in range(NUM_PROMPTS)))
    policy = root / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 2, "num_gpu_batches": 1, "weights": {"gpu": 0.3, "cpu": 0.2, "disk": 0.5},
        "cache": {"gpu": 1, "cpu": 0, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    args = ["--model", str(tiny_llama), "--prompts", str(prompts), "--max-new-tokens", "16", "--ignore-eos",
            "--temperature", "0.8", "--seed", "3", "--gpu-mem", "64MiB", "--cpu-mem", "64MiB",
            "--policy", str(policy), "--no-progress"]
    ref = root / "ref.jsonl"
    res = CliRunner().invoke(main, ["generate", *args, "--offload-dir", str(root / "ref-off"), "--out", str(ref)])
    assert res.exit_code == 0, res.output
    return args, ref.read_text()


def _user_files(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mydata.dat").write_text("user data")
    (folder / "index.json").write_text('{"mine": true}')


def _assert_user_files(folder):
    assert (folder / "mydata.dat").read_text() == "user data"
    assert (folder / "index.json").read_text() == '{"mine": true}'


def _cmd(args, out, offload):
    return [sys.executable, "-m", "flexlamps.cli", "generate", *args, "--out", str(out), "--offload-dir", str(offload)]


def _killed_at(cmd: list[str], point: tuple[str, int]) -> None:
    """Run `cmd` to the fault point, where it dies of SIGKILL (it must reach it)."""
    killed = subprocess.run(cmd, env={**os.environ, **kill_at(*point)}, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr[-2000:])


def _kill_generate_then_rerun(job, tmp_path, point):
    args, reference = job
    out, offload = tmp_path / "out.jsonl", tmp_path / "off"
    _user_files(offload)
    (tmp_path / "notes.txt").write_text("beside --out")
    _killed_at(_cmd(args, out, offload), point)
    done = subprocess.run(_cmd(args, out, offload), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == reference  # nothing lost, duplicated or stale; same order and values
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "off", "out.jsonl"]  # no lock files left
    _assert_user_files(offload)
    assert (tmp_path / "notes.txt").read_text() == "beside --out"


def test_kill_generate_quick(job, tmp_path):
    _kill_generate_then_rerun(job, tmp_path, GENERATE_KILL_QUICK)


@pytest.mark.slow
@pytest.mark.parametrize("point", GENERATE_KILLS, ids=[f"{p}-{n}" for p, n in GENERATE_KILLS])
def test_kill_generate(job, tmp_path, point):
    _kill_generate_then_rerun(job, tmp_path, point)


_WRITER = """
import sys, torch
from offload import DiskFolder
folder = DiskFolder(sys.argv[1], "fp")
folder.claim()
names = [f"t{k}" for k in range(40)]
if not folder.try_reuse(set(names)):
    folder.clear()
    folder.begin(set(names))
    for k, name in enumerate(names):
        folder.write(name, torch.full((4096,), float(k)))
        print(k, flush=True)
    folder.commit()
print("done", flush=True)
"""


def _kill_offload_writes_then_rerun(tmp_path, seed):
    root = tmp_path / "off"
    _user_files(root)
    kill_after = random.Random(seed).randrange(0, 40)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.strip() in (str(kill_after), "done"):
            break
    proc.kill()
    proc.wait()
    proc.stdout.close()
    again = subprocess.run([sys.executable, "-c", _WRITER, str(root)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.endswith("done\n"), again.stderr
    import torch

    from offload import DiskFolder

    folder = DiskFolder(root, "fp")
    folder.claim()
    assert folder.try_reuse({f"t{k}" for k in range(40)})  # complete and intact after the rerun
    for k in range(40):
        assert torch.equal(folder.read_into(f"t{k}", torch.empty(4096)), torch.full((4096,), float(k)))
    folder.release()
    _assert_user_files(root)
    assert sorted(p.name for p in root.iterdir()) == ["flexlamps-offload", "index.json", "mydata.dat"]


@pytest.mark.parametrize("seed", SEEDS_QUICK)
def test_kill_offload_writes_quick(tmp_path, seed):
    _kill_offload_writes_then_rerun(tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS_ALL)
def test_kill_offload_writes(tmp_path, seed):
    _kill_offload_writes_then_rerun(tmp_path, seed)


def test_full_disk_while_writing_results_then_rerun(job, tmp_path, monkeypatch):
    args, reference = job
    out = tmp_path / "out.jsonl"
    real_fsync, calls = os.fsync, []

    def fsync(fd):  # the results file's disk fills after 4 records
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".partial"):
            calls.append(fd)
        if len(calls) > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    res = CliRunner().invoke(main, ["generate", *args, "--out", str(out), "--offload-dir", str(tmp_path / "off")])
    assert res.exit_code != 0 and "disk filled up" in res.output and "rerun the same command" in res.output
    assert "Traceback" not in res.output and "Errno" not in res.output
    monkeypatch.setattr(os, "fsync", real_fsync)
    res = CliRunner().invoke(main, ["generate", *args, "--out", str(out), "--offload-dir", str(tmp_path / "off")])
    assert res.exit_code == 0, res.output
    assert out.read_text() == reference


def test_damaged_partial_file_is_repaired_by_rerun(job, tmp_path):
    args, reference = job
    out = tmp_path / "out.jsonl"
    lines = [json.loads(ln) for ln in reference.splitlines()]
    partial = out.with_name("out.jsonl.partial")
    rng = random.Random(0)
    body = [_with_check(rec) for rec in lines[:8]]  # the records of a killed run, then damage of every kind
    body[1] = body[1].replace('"text": "', '"text": "X', 1)  # a changed byte: caught by the line's CRC
    body[2] = body[2][: rng.randrange(5, len(body[2]) - 5)]  # a cut line in the middle
    body[3] = "[1, 2, 3]"
    body[4] = '{"text": "no id"}'
    partial.write_text("\n".join(body) + "\n" + body[5][:20])  # and a torn tail
    res = CliRunner().invoke(main, ["generate", *args, "--out", str(out), "--offload-dir", str(tmp_path / "off")])
    assert res.exit_code == 0, res.output
    assert "damaged" in res.output
    assert out.read_text() == reference


@pytest.mark.slow
@pytest.mark.ci
def test_concurrent_runs_on_one_out(job, tmp_path):
    args, reference = job
    out = tmp_path / "out.jsonl"
    cmds = [_cmd(args, out, tmp_path / f"off{k}") for k in range(2)]
    first = subprocess.Popen(cmds[0], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock_owner = out.with_name("out.jsonl.lock.owner")
    deadline = time.time() + 120
    while not lock_owner.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmds[1], capture_output=True, text=True, timeout=600)
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    if second.returncode != 0:  # refused while the first held --out
        assert f"--out {out} is in use by process {first.pid}" in second.stderr
    assert out.read_text() == reference


# stats that measure time or throughput differ between any two runs; the rest must be equal
# stats that describe the invocation, not the results: clocks, and how many requests a resumed
# run took from its progress log (num_requests_resumed is 0 in an uninterrupted run by design)
_TIMING = ("time", "runtime", "tok", "per_s", "wall", "latency", "resumed")


def _helm_results(out):
    """Per run folder: the predictions and the non-timing stats."""
    results = {}
    for run in sorted((out / "runs" / "s").iterdir()):
        if not run.is_dir():
            continue
        preds = json.loads((run / "display_predictions.json").read_text())
        stats = [s for s in json.loads((run / "stats.json").read_text())
                 if not any(word in s["name"]["name"] for word in _TIMING)]
        results[run.name] = ([(p["instance_id"], p["predicted_text"]) for p in preds], stats)
    return results


def _kill_helm_then_rerun(tiny_llama, tmp_path, point):
    cmd = [sys.executable, "-m", "flexlamps.cli", "helm", "--model", str(tiny_llama), "--scenario", "demo",
           "--suite", "s", "--batch-size", "2", "--max-tokens", "4"]
    ref = subprocess.run(cmd + ["--output-path", str(tmp_path / "ref")], capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr
    out = tmp_path / "out"
    _killed_at(cmd + ["--output-path", str(out)], point)
    done = subprocess.run(cmd + ["--output-path", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert _helm_results(out) == _helm_results(tmp_path / "ref")


@pytest.mark.slow
@pytest.mark.parametrize("point", [pytest.param(p, marks=pytest.mark.ci) if p == HELM_KILLS[1] else p
                                   for p in HELM_KILLS], ids=[f"{p}-{n}" for p, n in HELM_KILLS])
def test_kill_helm(tiny_llama, tmp_path, point):
    _kill_helm_then_rerun(tiny_llama, tmp_path, point)
