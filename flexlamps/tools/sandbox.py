"""Run untrusted Python (a model's program, a user's tool function) in a subprocess that cannot
hurt the run: wall-clock and CPU-time limits, a memory cap, no network, a fresh temp dir as its
cwd (writes elsewhere refused), output capped. Whatever the code does (hang, crash, print
gigabytes, open a socket), the caller gets a `ToolResult` whose `text` says what happened; only
a broken sandbox itself raises.

The child (`_child.py`) sets the limits and guards on itself before the job runs; the parent
enforces the wall clock by killing the child's whole process group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_CHILD = Path(__file__).with_name("_child.py")
_RESULT = ".tool_result.json"  # inside the temp dir: the child may only write there


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # the child is killed after this long
    cpu_s: int = 10  # CPU seconds (SIGXCPU past it)
    memory_bytes: int = 1 << 30  # address space
    output_bytes: int = 64 << 10  # stdout + stderr together (SIGXFSZ past it)
    max_chars: int = 2000  # of output handed back in `ToolResult.text` (its tail)
    network: bool = False  # True: skip the network namespace (the socket guard stays)

    def __post_init__(self):
        if self.wall_s <= 0 or self.cpu_s < 1 or self.memory_bytes < (64 << 20) or self.output_bytes < 1024:
            raise ValueError(f"sandbox limits too small: {self} (wall_s > 0, cpu_s >= 1, memory_bytes >= 64 MiB, "
                             f"output_bytes >= 1 KiB)")


@dataclass(frozen=True)
class ToolResult:
    status: str  # ok, error (exception / non-zero exit), timeout, cpu_limit, output_limit, killed
    output: str  # stdout + stderr, capped, the temp dir's path replaced by "."
    seconds: float  # wall time of the child, measured
    value: str | None = None  # a tool function's return value (call mode)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def text(self, max_chars: int = 2000) -> str:
        """What the model reads: the value, or what went wrong and the output's tail."""
        if self.ok:
            body = self.value if self.value is not None else self.output
            return _tail(body, max_chars)
        return _tail(f"{_STATUS_WORDS[self.status]}\n{self.output}".rstrip(), max_chars)


_STATUS_WORDS = {
    "error": "error:",
    "timeout": "error: the tool ran past its time limit and was stopped",
    "cpu_limit": "error: the tool used up its CPU-time limit and was stopped",
    "output_limit": "error: the tool's output exceeded its limit and it was stopped",
    "killed": "error: the tool was killed (out of memory?)",
}


def _tail(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else "..." + text[-(max_chars - 3):]


def run_program(source: str, limits: Limits = Limits(), files: dict[str, str] | None = None) -> ToolResult:
    """Run `source` as program.py (as __main__) in a fresh temp dir, beside `files`."""
    return _run({"mode": "program", "program": "program.py"}, limits, {"program.py": source, **(files or {})})


def call_function(module: str | os.PathLike, function: str, arguments: dict, limits: Limits = Limits()) -> ToolResult:
    """Call `function(**arguments)` of the Python file `module` in the sandbox; its return value
    (a string, or anything JSON can write) comes back as `value`."""
    job = {"mode": "call", "module": os.path.abspath(module), "function": function, "arguments": arguments}
    return _run(job, limits, {})


def describe_tools(module: str | os.PathLike, limits: Limits = Limits()) -> list[dict]:
    """The tools of the Python file `module` as JSON schemas (name, description, parameters),
    read in the sandbox (importing the module runs its code)."""
    res = _run({"mode": "describe", "module": os.path.abspath(module)}, limits, {})
    if not res.ok:
        raise ValueError(f"could not read the tools of {module}: {res.text()}")
    return json.loads(res.value)


def _run(job: dict, limits: Limits, files: dict[str, str]) -> ToolResult:
    base = tempfile.mkdtemp(prefix="flexlamps-tool-")
    root = os.path.join(base, "work")
    try:
        os.mkdir(root)
        for name, text in files.items():
            Path(root, name).write_text(text, encoding="utf-8")
        job = {**job, "cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
               "output_bytes": limits.output_bytes, "unshare_network": not limits.network, "result": _RESULT}
        job_path = os.path.join(base, "job.json")
        Path(job_path).write_text(json.dumps(job), encoding="utf-8")
        out_path = os.path.join(base, "output.txt")
        status, seconds = _spawn(job_path, root, out_path, limits.wall_s)
        if status in ("ok", "error") and os.path.getsize(out_path) >= limits.output_bytes:
            status = "output_limit"  # python ignores SIGXFSZ: its write failed instead
        with open(out_path, "rb") as f:
            output = f.read(limits.output_bytes).decode("utf-8", errors="replace").replace(root, ".")
        value = None
        result = Path(root, _RESULT)
        if status == "ok" and job["mode"] != "program":
            if not result.is_file():
                status, output = "error", output + "\n(the tool wrote no result)"
            else:
                data = json.loads(result.read_text(encoding="utf-8"))
                value = data if job["mode"] == "describe" else data["value"]
                value = json.dumps(value) if job["mode"] == "describe" else value
        return ToolResult(status, output, seconds, value)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _spawn(job_path: str, root: str, out_path: str, wall_s: float) -> tuple[str, float]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": root, "TMPDIR": root,
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0"}
    start = time.perf_counter()
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-I", str(_CHILD), job_path], cwd=root, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return "timeout", time.perf_counter() - start
    seconds = time.perf_counter() - start
    _kill_group(proc)  # anything it left behind in its group
    if code == 0:
        return "ok", seconds
    if code < 0:
        sig = -code
        return {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "output_limit"}.get(sig, "killed"), seconds
    with open(out_path, "ab") as out:
        out.write(f"\n(exit code {code})".encode())
    return "error", seconds


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
