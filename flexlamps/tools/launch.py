"""Start the sandbox's child, hand it its job, read its result, and end it: whatever the child
does, this returns an `Outcome` by the wall clock, and nothing the child started is left running.

Channels: the job goes in on stdin; stdout and stderr go to an unlinked temp file (no name, in no
folder the child sees; RLIMIT_FSIZE caps it); the result comes back on a pipe (`Fds.result`) read
here. Behind bubblewrap (bwrap.py) the child's processes live in a PID namespace whose pid 1 is
killed with bwrap (`--die-with-parent`); the call waits until that pid 1 is gone, and the kernel
ends a PID namespace's other processes before its pid 1 (so none outlives the call). Unboxed
(`--unsafe-tools`), the child is a plain process in a temp dir, killed by process group.
"""

from __future__ import annotations

import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flexlamps.tools import bwrap

CHILD = str(Path(__file__).with_name("_child.py"))
RESULT_BYTES = 4 << 20  # a result longer than this is refused (the child is stopped)


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None  # None: killed at the wall clock
    signal: int | None  # the signal that ended the child, if one did
    result: bytes  # what came back on the result pipe (at most RESULT_BYTES + 1 bytes)
    output: bytes  # stdout + stderr, at most `output_bytes`
    output_size: int  # bytes the child wrote to its output (the engine reads `output_bytes` at most)
    seconds: float


def run_child(job: bytes, *, wall_s: float, output_bytes: int, disk_bytes: int, network: bool,
              boxed: bool, seccomp: bytes | None = None) -> Outcome:
    """Run _child.py on `job` (JSON bytes), behind bubblewrap when `boxed`."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        if boxed:
            (code, sig, result), work_dir = _run_boxed(job, out, wall_s, disk_bytes, network, seccomp), bwrap.WORK_DIR
        else:
            code, sig, result, work_dir = _run_unboxed(job, out, wall_s)
        seconds = time.perf_counter() - start
        size = out.seek(0, os.SEEK_END)
        out.seek(0)
        output = out.read(output_bytes).replace(work_dir.encode(), b".")  # the same text in every run
        return Outcome(code, sig, result, output, size, seconds)


def _run_boxed(job, out, wall_s, disk_bytes, network, seccomp):
    deadline = time.monotonic() + wall_s
    root = bwrap.as_root()
    pipes = {name: os.pipe() for name in ("result", "info", "seccomp", *(("block",) if root else ()))}
    fds = bwrap.Fds(result=pipes["result"][1], info=pipes["info"][1], seccomp=pipes["seccomp"][0],
                    block=pipes["block"][0] if root else None)
    os.write(pipes["seccomp"][1], seccomp)  # a few hundred bytes: the pipe holds them
    os.close(pipes["seccomp"][1])
    args = bwrap.command(bwrap.executable(), fds, disk_bytes, network, CHILD)
    keep = tuple(fd for fd in (fds.result, fds.info, fds.seccomp, fds.block) if fd is not None)
    ours = (pipes["info"][0], *((pipes["block"][1],) if root else ()))
    try:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=out, stderr=out, pass_fds=keep, env={},
                                start_new_session=True, **({"extra_groups": []} if root else {}))
    except BaseException:
        for fd in (*ours, pipes["result"][0]):
            os.close(fd)
        raise
    finally:
        for fd in keep:
            os.close(fd)
    pidfd = None
    try:
        try:
            with _closing(*ours):
                pid = (bwrap.map_users(*ours) if root
                       else bwrap.sandbox_pid(pipes["info"][0]))
        except OSError:  # bwrap failed (its message is in the output) or the maps could not be written
            _end(proc, None)  # it runs nothing more
            return (*_decode(proc.returncode, boxed=True), b"")
        pidfd = _pidfd(pid)
        result = _exchange(proc, job, pipes["result"][0], deadline)
        return (*_decode(_wait(proc, _stop_if_over(result, deadline)), boxed=True), result)
    finally:
        os.close(pipes["result"][0])
        _end(proc, pidfd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:  # already gone, with everything in its namespace
        return None


def _run_unboxed(job, out, wall_s):
    deadline = time.monotonic() + wall_s
    folder = tempfile.mkdtemp(prefix="flexlamps-tool-")
    read_fd, write_fd = os.pipe()
    env = {**bwrap.ENV, "HOME": folder, "TMPDIR": folder}
    try:
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", CHILD, str(write_fd)], cwd=folder, env=env,
                                    stdin=subprocess.PIPE, stdout=out, stderr=out, pass_fds=(write_fd,),
                                    start_new_session=True)
        finally:
            os.close(write_fd)
        try:
            result = _exchange(proc, job, read_fd, deadline)
            return (*_decode(_wait(proc, _stop_if_over(result, deadline)), boxed=False), result, folder)
        finally:
            os.close(read_fd)
            _end(proc, None)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _closing:
    def __init__(self, *fds):
        self.fds = fds

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for fd in self.fds:
            os.close(fd)


def _exchange(proc: subprocess.Popen, job: bytes, result_fd: int, deadline: float) -> bytes:
    """Write the job to the child's stdin and read its result pipe until the pipe closes (every
    holder gone), the wall clock runs out, or the result outgrows RESULT_BYTES."""
    result, sent = bytearray(), 0
    stdin = proc.stdin.fileno()
    os.set_blocking(stdin, False)
    with selectors.DefaultSelector() as sel:
        sel.register(stdin, selectors.EVENT_WRITE)
        sel.register(result_fd, selectors.EVENT_READ)
        while len(result) <= RESULT_BYTES and (left := deadline - time.monotonic()) > 0:
            events = sel.select(left)
            for key, _ in events:
                if key.fd == result_fd:
                    chunk = os.read(result_fd, 1 << 16)
                    if not chunk:
                        return bytes(result)
                    result += chunk
                    continue
                try:
                    sent += os.write(stdin, job[sent:sent + (1 << 16)])
                except BrokenPipeError:
                    sent = len(job)  # the child closed its stdin: it has what it read
                if sent >= len(job):
                    sel.unregister(stdin)
                    proc.stdin.close()
    return bytes(result)


def _stop_if_over(result: bytes, deadline: float) -> float:
    """A result past RESULT_BYTES ends the child now (it may be blocked writing more)."""
    return time.monotonic() if len(result) > RESULT_BYTES else deadline


def _wait(proc: subprocess.Popen, deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def _end(proc: subprocess.Popen, pidfd: int | None) -> None:
    """Kill what is left (bwrap's process group; its sandbox dies with it) and wait for the
    sandbox's pid 1 to be gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    if pidfd is not None:
        select.select([pidfd], [], [], 30.0)  # readable once the process has exited
        os.close(pidfd)


def _decode(code: int | None, boxed: bool) -> tuple[int | None, int | None]:
    """(exit code, signal): bwrap reports a child killed by signal N as exit code 128 + N."""
    if code is None:
        return None, None
    if code < 0:
        return code, -code
    if boxed and code > 128 and code - 128 < signal.NSIG:
        return code, code - 128
    return code, None
