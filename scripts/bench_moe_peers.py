"""The MoE bench's sides, each run in its own process under one memory cap: flexlamps (planned by
`policy="auto"` for the run's budgets), Accelerate's disk offload (transformers `device_map="auto"`
with an offload folder) and llama.cpp (`llama-batched-bench` on the GGUF of the same weights).

Every side runs a workload twice, generating 1 token (the prefill) and then `gen_len` tokens; the
difference is its decode: seconds, and bytes read (`/proc/<pid>/io`: `read_bytes`, what came
from the disk, page faults of mmap'ed files included; `rchar`, what read() returned, page cache
hits included). The files a side reads are dropped from the page cache before each run.

The cap is a memory cgroup created as root (v2 `memory.max`, or v1 `memory.limit_in_bytes`): the
page cache a side fills is charged to it, so no side is served from memory it was not given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CGROUP_NAME = "flexlamps-bench-moe"


def io_counters(pid: int | str = "self") -> dict[str, int]:
    with open(f"/proc/{pid}/io") as fh:
        fields = dict(line.split(": ") for line in fh.read().splitlines())
    return {"read_bytes": int(fields["read_bytes"]), "rchar": int(fields["rchar"])}


def drop_page_cache(*folders: Path) -> None:
    """Drop these files' pages from the page cache (POSIX_FADV_DONTNEED): only theirs, not the machine's."""
    for folder in folders:
        paths = [folder] if folder.is_file() else [p for p in folder.rglob("*") if p.is_file()]
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class MemoryCap:
    """A memory cgroup of `limit_bytes` that each side's process joins; `path` None (with `why`) where
    none can be made (not root, no memory controller)."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes, self.path, self.why = limit_bytes, None, ""
        v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")
        try:
            controllers = v2 / "cgroup.controllers"
            if controllers.exists() and "memory" in controllers.read_text().split():
                self.path, limit_file = v2 / CGROUP_NAME, "memory.max"
            elif (v1 / "memory.limit_in_bytes").exists():
                self.path, limit_file = v1 / CGROUP_NAME, "memory.limit_in_bytes"
            else:
                self.why = "no memory cgroup controller (neither v2 memory.max nor v1 memory) is mounted"
                return
            self.path.mkdir(exist_ok=True)
            (self.path / limit_file).write_text(str(limit_bytes))
        except OSError as exc:
            self.path, self.why = None, f"cannot create a memory cgroup ({exc.strerror}; it needs root)"

    def join(self) -> None:
        """Put the calling process in the cgroup (a child's preexec_fn)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def describe(self) -> str:
        if self.path is None:
            return f"no memory cap: {self.why}; every side may use the page cache freely"
        return f"memory cgroup {self.path} capped at {self.limit_bytes / 2**30:.2f} GiB for every side"

    def close(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


def run_capped(cap: MemoryCap, cmd: list[str], timeout_s: float) -> tuple[str, dict[str, int], float]:
    """(stdout, its bytes read, seconds) of `cmd` run in the cgroup, its /proc io polled until it ends."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap.join)
    last = {"read_bytes": 0, "rchar": 0}
    while proc.poll() is None:
        try:
            last = io_counters(proc.pid)
        except (OSError, KeyError, ValueError):
            pass
        if time.perf_counter() - t > timeout_s:
            proc.kill()
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}: {err[-800:]}")
    return out, last, time.perf_counter() - t


def llama_jsonl_row(cap: MemoryCap, cmd: list[str], timeout_s: float, tries: int = 3) -> tuple[dict, dict[str, int]]:
    """llama-batched-bench's one JSON row (and its bytes read), run in the cgroup; run again where it
    exited 0 with no row (seen under load: an empty stdout), up to `tries` times."""
    for _ in range(tries):
        out, read, _ = run_capped(cap, cmd, timeout_s)
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if len(rows) == 1:
            return rows[0], read
    raise RuntimeError(f"unexpected llama-batched-bench output after {tries} runs: {out[-500:]!r}")


def worker_command(side: str, args, batch: int, prompt_len: int, gen_len: int) -> list[str]:
    """The command that runs `side` as a worker of this script (prints one JSON line)."""
    return [sys.executable, str(Path(__file__).with_name("bench_moe.py")), "--worker", side, "--model", str(args.model),
            "--batch", str(batch), "--prompt-len", str(prompt_len), "--gen-len", str(gen_len),
            "--gpu-mem", str(args.gpu_mem), "--cpu-mem", str(args.cpu_mem), "--offload-dir", str(args.offload_dir),
            "--threads", str(args.threads)]


def llama_cpp_runs(cap: MemoryCap, binary: str, gguf: Path, batch: int, prompt_len: int, gen_len: int,
                   threads: int, timeout_s: float) -> dict:
    """llama-batched-bench for 1 and for `gen_len` new tokens: {gen: (seconds, bytes read)}; its own timing
    (`t`: prefill and decode of the batch, model load excluded; `t_tg`: its `gen` decode steps alone), our
    /proc counts."""
    runs = {}
    for gen in (1, gen_len):
        drop_page_cache(gguf)
        cmd = [binary, "-m", str(gguf), "-c", str(batch * (prompt_len + gen) + 16), "-b", "2048", "-ub", "512",
               "-npp", str(prompt_len), "-ntg", str(gen), "-npl", str(batch), "-t", str(threads),
               "--output-format", "jsonl"]
        row, read = llama_jsonl_row(cap, cmd, timeout_s)
        runs[gen] = {"s": row["t"], "t_tg": row["t_tg"], **read}
    return runs
