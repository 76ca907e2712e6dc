"""Run untrusted Python (a model's program, a user's tool function) so it cannot hurt the run:
behind an OS boundary (bubblewrap with a seccomp filter, see bwrap.py), with wall-clock, CPU-time,
memory, process, output and disk limits. Whatever the code does (hang, crash, print gigabytes,
exit early, kill itself, write garbage where its result goes), the caller gets a `ToolResult`
whose `text` says what happened; only a sandbox that itself broke raises.

A run passes (`ok`) only when the job ran to its end: the child writes a line holding a nonce the
code never sees (it comes on stdin, read before the code runs) on a pipe only the engine reads,
after the program's last statement ran or the tool function returned. An exit of any kind before
that is status `exited`. (Code that digs the nonce out of its own interpreter's memory and writes
that line itself is beyond this check: the nonce guards against ending early, not against forgery
by code that reads its own process.)

Where no boundary can be made (no bubblewrap, user namespaces off) calls raise
`SandboxUnavailable` naming what to install, unless `Limits(unsafe=True)` (`agents
--unsafe-tools`): the child then runs as a plain process in a temp dir, guarded only by resource
limits and an audit hook (PEP 578: no security boundary).
"""

from __future__ import annotations

import functools
import hmac
import json
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

from flexlamps.tools import bwrap, launch, seccomp


class SandboxUnavailable(RuntimeError):
    """No OS boundary can be made here; the message names what to install."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0  # the child is killed after this long
    cpu_s: int = 10  # CPU seconds (SIGXCPU past it)
    memory_bytes: int = 1 << 30  # address space of each process
    output_bytes: int = 64 << 10  # stdout + stderr together (SIGXFSZ past it)
    disk_bytes: int = 64 << 20  # the work dir's total size (a tmpfs); one file at most output_bytes
    processes: int = 16  # processes and threads at once (RLIMIT_NPROC, in the sandbox's namespace)
    max_chars: int = 2000  # of output handed back in `ToolResult.text` (its tail)
    network: bool = False  # True: share the host's network (no network namespace)
    unsafe: bool = False  # True: run without the OS boundary (`agents --unsafe-tools`)

    def __post_init__(self):
        if (self.wall_s <= 0 or self.cpu_s < 1 or self.memory_bytes < (64 << 20) or self.output_bytes < 1024
                or self.disk_bytes < (1 << 20) or self.processes < 4):
            raise ValueError(f"sandbox limits too small: {self} (wall_s > 0, cpu_s >= 1, memory_bytes >= 64 MiB, "
                             f"output_bytes >= 1 KiB, disk_bytes >= 1 MiB, processes >= 4)")


@dataclass(frozen=True)
class ToolResult:
    status: str  # ok, error (exception / non-zero exit), exited (ended early), timeout, cpu_limit, output_limit,
    # killed
    output: str  # stdout + stderr, capped, the work dir's path replaced by "."
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
    "exited": "error: the code ended before it ran to its end (exit(), sys.exit(), os._exit() or a signal before "
              "its last statement): that is a failure",
    "timeout": "error: the tool ran past its time limit and was stopped",
    "cpu_limit": "error: the tool used up its CPU-time limit and was stopped",
    "output_limit": "error: the tool's output exceeded its limit and it was stopped",
    "killed": "error: the tool was killed (out of memory?)",
}


def _tail(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else "..." + text[-(max_chars - 3):]


def run_program(source: str, limits: Limits = Limits(), files: dict[str, str] | None = None) -> ToolResult:
    """Run `source` as program.py (as __main__) in a fresh work dir, beside `files`."""
    return _run({"mode": "program", "program": "program.py"}, limits, {"program.py": source, **(files or {})})


def call_function(module: str | os.PathLike, function: str, arguments: dict, limits: Limits = Limits()) -> ToolResult:
    """Call `function(**arguments)` of the Python file `module` in the sandbox; its return value
    (a string, or anything JSON can write) comes back as `value`. The file is copied into the
    work dir (the sandbox sees nothing beside it)."""
    name, source = _module_source(module)
    if source is None:
        return ToolResult("error", f"could not read the tools file {module}", 0.0)
    job = {"mode": "call", "module": name, "module_name": name, "function": function, "arguments": arguments}
    return _run(job, limits, {name: source})


def describe_tools(module: str | os.PathLike, limits: Limits = Limits()) -> list[dict]:
    """The tools of the Python file `module` as JSON schemas (name, description, parameters),
    read in the sandbox (importing the module runs its code)."""
    name, source = _module_source(module)
    if source is None:
        raise ValueError(f"could not read the tools file {module}")
    res = _run({"mode": "describe", "module": name}, limits, {name: source})
    if not res.ok:
        raise ValueError(f"could not read the tools of {module}: {res.text()}")
    return json.loads(res.value)


def _module_source(module: str | os.PathLike) -> tuple[str, str | None]:
    name = os.path.basename(os.fspath(module)) or "tools.py"
    try:
        return name, Path(module).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return name, None


@functools.lru_cache(maxsize=1)
def boundary_problem() -> str | None:
    """Why no OS boundary can be made here (one line naming what to install), or None. Checked once
    per process, by running a program in the sandbox."""
    path = bwrap.executable()
    if path is None:
        return f"no sandbox for model-written code: bubblewrap (bwrap) is not on PATH; {bwrap.INSTALL}"
    problem = bwrap.version_problem(path)
    if problem is not None:
        return problem
    try:
        seccomp.filter_bpf()
    except Exception as e:  # noqa: BLE001 (pyseccomp raises RuntimeError, ctypes OSError / AttributeError)
        return (f"the sandbox's seccomp filter needs libseccomp and pyseccomp ({type(e).__name__}: {e}); install "
                f"libseccomp2 (apt-get install libseccomp2) and pyseccomp (pip install pyseccomp)")
    probe = _execute({"mode": "program", "program": "program.py"}, Limits(wall_s=120), {"program.py": "pass"}, True)
    if not probe.ok:
        said = [line for line in probe.output.splitlines() if line.strip() and not line.startswith("(exit code")]
        last = said[-1] if said else probe.status
        return (f"bubblewrap cannot make a sandbox here ({last}); user namespaces must be allowed "
                f"(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1)")
    return None


def _run(job: dict, limits: Limits, files: dict[str, str]) -> ToolResult:
    if not limits.unsafe and (problem := boundary_problem()) is not None:
        raise SandboxUnavailable(problem)
    return _execute(job, limits, files, boxed=not limits.unsafe)


def _execute(job: dict, limits: Limits, files: dict[str, str], boxed: bool) -> ToolResult:
    nonce = secrets.token_hex(16)
    payload = {**job, "nonce": nonce, "files": files, "cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
               "output_bytes": limits.output_bytes,
               # unboxed, RLIMIT_NPROC would count every process of the user
               "processes": limits.processes if boxed else None}
    outcome = launch.run_child(json.dumps(payload).encode(), wall_s=limits.wall_s, output_bytes=limits.output_bytes,
                               disk_bytes=limits.disk_bytes, network=limits.network, boxed=boxed,
                               seccomp=seccomp.filter_bpf() if boxed else None)
    return _result(outcome, nonce, limits)


def _result(outcome: launch.Outcome, nonce: str, limits: Limits) -> ToolResult:
    """What the child's exit, output and result line say, as a ToolResult (never an exception)."""
    output = outcome.output.decode("utf-8", errors="replace")
    seconds = outcome.seconds
    if len(outcome.result) > launch.RESULT_BYTES:
        return ToolResult("output_limit", output + f"\n(its result passed {launch.RESULT_BYTES} bytes)", seconds)
    if outcome.exit_code is None:
        return ToolResult("timeout", output, seconds)
    if outcome.signal is not None:
        status = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "output_limit"}.get(outcome.signal, "killed")
        return ToolResult(status, output, seconds)
    if outcome.output_size >= limits.output_bytes:
        return ToolResult("output_limit", output, seconds)  # python ignores SIGXFSZ: its write failed instead
    if outcome.exit_code != 0:
        return ToolResult("error", output + f"\n(exit code {outcome.exit_code})", seconds)
    found, note = completion(outcome.result, nonce)
    if not found:
        return ToolResult("exited", (output + "\n" + note).strip() if note else output, seconds)
    return ToolResult("ok", output, seconds, found[0])


def completion(data: bytes, nonce: str) -> tuple[list, str | None]:
    """The values of the result lines holding `nonce` (the child writes one), and a note on what
    else came back on the result pipe (garbage a tool wrote there, or too much)."""
    found = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if (isinstance(record, dict) and isinstance(record.get("nonce"), str)
                and hmac.compare_digest(record["nonce"], nonce) and "value" in record):
            found.append(record["value"])
    if len(found) == 1:
        return found, None
    return [], "(no valid result came back)" if data.strip() else None
