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
import threading
import time
from pathlib import Path

# one cgroup per bench process: two benches at once (bench_moe.py, bench_moe_job.py) would share one cap
CGROUP_NAME = f"flexlamps-bench-moe-{os.getpid()}"


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
    """(stdout, its bytes read, seconds) of `cmd` run in the cgroup. `read_bytes` is exact: the
    child's own count at its exit (`wait4`'s `ru_inblock`, in 512-byte units: every thread, page
    faults of mmap'ed files included), where a poll of /proc/<pid>/io misses what it read after the
    last poll (and reads nothing once the child is reaped); `rchar` is the last poll's (no rusage
    field counts it). Its output is drained while it runs, so a chatty child never blocks on a pipe."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap.join)
    streams = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda f=f, into=into: into.append(f.read()), daemon=True)
               for f, into in ((proc.stdout, streams["out"]), (proc.stderr, streams["err"]))]
    for reader in readers:
        reader.start()
    last, polls = {"read_bytes": 0, "rchar": 0}, []
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            last = io_counters(proc.pid)
            polls.append((time.perf_counter() - t, last["read_bytes"]))
        except (OSError, KeyError, ValueError):
            pass
        if time.perf_counter() - t > timeout_s:
            proc.kill()
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join()
    out, err = "".join(streams["out"]), "".join(streams["err"])
    if proc.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} exited with {proc.returncode}: {err[-800:]}")
    seconds, read_bytes = time.perf_counter() - t, usage.ru_inblock * 512
    return out, {"read_bytes": read_bytes, "rchar": last["rchar"], "polls": polls + [(seconds, read_bytes)]}, seconds


def read_in_last(polls: list[tuple[float, int]], seconds: float) -> float:
    """Bytes read in the last `seconds` of a run polled as (time, bytes read so far), the last
    poll at its exit: the bytes at the end less those at that time (interpolated between polls)."""
    end_t, end_bytes = polls[-1]
    at = max(0.0, end_t - seconds)
    before = [(pt, pb) for pt, pb in polls if pt <= at] or [(0.0, 0)]
    after = next((pt, pb) for pt, pb in polls if pt >= at)
    (t0, b0), (t1, b1) = before[-1], after
    return end_bytes - (b0 + (b1 - b0) * ((at - t0) / (t1 - t0) if t1 > t0 else 0.0))


def llama_jsonl_row(cap: MemoryCap, cmd: list[str], timeout_s: float, tries: int = 3,
                    drop: tuple[Path, ...] = ()) -> tuple[dict, dict[str, int]]:
    """llama-batched-bench's one JSON row (and its bytes read), run in the cgroup; run again where it
    exited 0 with no row (seen under load: an empty stdout), up to `tries` times, each from a page
    cache without the files `drop` (a try after one that read them would read less)."""
    for _ in range(tries):
        drop_page_cache(*drop)
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
    /proc counts, and `decode_read_bytes`: what it read in its decode, the last `t_tg` seconds before
    it exited (its row is printed, and the model freed, as the decode ends). The difference of the
    two runs' totals is no measure of that: under a cap each run's load reads the mmap'ed model
    anew, and how much of it is read twice varies by more than the decode reads (seen: -151 MiB a
    step at full size)."""
    runs = {}
    for gen in (1, gen_len):
        cmd = [binary, "-m", str(gguf), "-c", str(batch * (prompt_len + gen) + 16), "-b", "2048", "-ub", "512",
               "-npp", str(prompt_len), "-ntg", str(gen), "-npl", str(batch), "-t", str(threads),
               "--output-format", "jsonl"]
        row, read = llama_jsonl_row(cap, cmd, timeout_s, drop=(gguf,))
        decode_bytes = read_in_last(read.pop("polls"), row["t_tg"])
        runs[gen] = {"s": row["t"], "t_tg": row["t_tg"], "decode_read_bytes": decode_bytes, **read}
    return runs
