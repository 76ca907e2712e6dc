"""The sandbox's child, started as `python -I -S _child.py RESULT_FD [UID GID]` with its work dir as
cwd (inside bubblewrap, or a temp dir with --unsafe-tools). Standard library only: the child
imports nothing of flexlamps, and flexlamps is not in the sandbox.

In order, before any of the job's code runs:
1. with UID GID (the engine runs as root): drop to that uid and gid, and check no capability is
   left (bubblewrap starts it as root of the sandbox's user namespace so it can; see bwrap.py);
2. site-packages (after the drop: `-S` kept installed packages' .pth files from running as root);
3. the job (JSON) is read from stdin, which then reads /dev/null: its `nonce` stays out of the files;
4. its files are written to the work dir; the resource limits are set; the audit hook is installed
   (a second layer only: the boundary is the OS's, see sandbox.py).

The result goes to RESULT_FD, a pipe the engine reads: one JSON line holding the nonce, written
only once the job ran to its end (a program's last statement ran, a tool returned). An exit of
any kind before that (exit(), sys.exit(), os._exit(), a signal) leaves no such line, and the
engine records the run as ended early.
"""

import json
import os
import resource
import sys
import traceback

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# audit events whose first (and for the two-path ones, second) argument is a path being changed
_ONE_PATH = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
             "shutil.rmtree", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr"}
_TWO_PATHS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
              "shutil.move"}
_SPAWN = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.startfile",
          "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym",
          "ctypes.call_function"}


def _drop_to(uid: int, gid: int) -> None:
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    with open("/proc/self/status", encoding="ascii") as f:
        caps = {k: int(v, 16) for k, v in (line.split(":\t") for line in f) if k in ("CapPrm", "CapEff", "CapAmb")}
    if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or any(caps.values()):
        os._exit(70)  # the engine reports exit code 70 as a broken sandbox


def _read_job() -> dict:
    with os.fdopen(os.dup(0), "rb") as f:
        job = json.loads(f.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return job


def _limit(job: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_bytes"], job["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["output_bytes"], job["output_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if job["processes"] is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (job["processes"], job["processes"]))


def _guard(root: str) -> None:
    """The audit hook: refuses sockets, writes outside `root` and new processes from plain Python."""
    root = os.path.realpath(root)

    def inside(path) -> bool:
        if isinstance(path, int):  # an open descriptor: its opening was checked
            return True
        full = os.path.realpath(os.fsdecode(path))
        return full == root or full.startswith(root + os.sep)

    def refuse(what: str):
        raise PermissionError(f"sandbox: {what} refused")

    def hook(event: str, args: tuple) -> None:
        if event.startswith("socket."):
            refuse(f"network access ({event})")
        elif event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writes and path is not None and not inside(path):
                refuse(f"writing {os.fsdecode(path)!r} outside the sandbox's temp dir")
        elif event in _ONE_PATH:
            if args and not inside(args[0]):
                refuse(f"{event} of {os.fsdecode(args[0])!r} outside the sandbox's temp dir")
        elif event in _TWO_PATHS:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    refuse(f"{event} of {os.fsdecode(path)!r} outside the sandbox's temp dir")
        elif event in _SPAWN:
            refuse(f"starting or signalling processes, or native code ({event})")

    sys.addaudithook(hook)


def _run_program(job: dict) -> None:
    with open(job["program"], encoding="utf-8") as f:
        source = f.read()
    # a fixed file name (not the work dir's path): tracebacks read the same in every run
    code = compile(source, os.path.basename(job["program"]), "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


def _load_module(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tools_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _call(job: dict):
    fn = getattr(_load_module(job["module"]), job["function"], None)
    if not callable(fn):
        raise LookupError(f"no tool function {job['function']!r} in {job['module_name']}")
    value = fn(**job["arguments"])
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _describe(job: dict):
    """The module's tools as JSON schemas: its public functions (or those it lists in TOOLS)."""
    import inspect

    module = _load_module(job["module"])
    names = getattr(module, "TOOLS", None)
    fns = [getattr(module, n) if isinstance(n, str) else n for n in names] if names is not None else [
        v for k, v in vars(module).items()
        if inspect.isfunction(v) and not k.startswith("_") and v.__module__ == module.__name__]
    kinds = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
    tools = []
    for fn in fns:
        params = inspect.signature(fn).parameters
        props = {n: {"type": kinds.get(p.annotation, "string")} for n, p in params.items()}
        required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
        tools.append({"name": fn.__name__, "description": inspect.getdoc(fn) or "",
                      "parameters": {"type": "object", "properties": props, "required": required}})
    return json.dumps(tools)


def main() -> None:
    result_fd = int(sys.argv[1])
    if len(sys.argv) == 4:
        _drop_to(int(sys.argv[2]), int(sys.argv[3]))
    import site

    site.main()
    job = _read_job()
    nonce = job.pop("nonce")
    for name, text in job.pop("files").items():
        with open(name, "w", encoding="utf-8") as f:
            f.write(text)
    _limit(job)
    sys.dont_write_bytecode = True
    _guard(os.getcwd())
    run = {"program": _run_program, "call": _call, "describe": _describe}[job["mode"]]
    try:
        value = run(job)
    except BaseException as e:  # SystemExit too: its traceback shows where the code ended early
        _print_user_traceback(e)
        code = (0 if e.code is None else e.code) if isinstance(e, SystemExit) else 1
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
    _flush()
    with os.fdopen(result_fd, "wb") as f:  # a blocking pipe: all of it, however long
        f.write(b"\n" + json.dumps({"nonce": nonce, "value": value}).encode() + b"\n")
    os._exit(0)  # the run is over: what the code left (threads, atexit) has no say in it


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the code closed or filled its output: what it printed is what there is


def _print_user_traceback(e: BaseException) -> None:
    """The traceback without this file's frames (the same text in every run and checkout)."""
    te = traceback.TracebackException.from_exception(e)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if os.path.abspath(f.filename) != os.path.abspath(__file__)])
    _flush()
    try:
        sys.stderr.write("".join(te.format()))
    except (OSError, ValueError):
        pass
    _flush()


if __name__ == "__main__":
    main()
