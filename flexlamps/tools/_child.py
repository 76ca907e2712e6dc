"""The sandbox's child: started as `python -I _child.py JOB.json` with the fresh temp dir as
cwd, it limits itself, cuts its network, installs the guards and only then runs the job.
Standard library only (the child imports nothing of flexlamps).

The guards: resource limits (CPU seconds, address space, file size = the output cap, no core
files), a network namespace of its own (when the kernel lets it: root), and an audit hook that
refuses sockets, writes outside the temp dir and new processes. The hook guards plain Python
(model-written programs, tool functions); it is no boundary against native code, which is why
foreign calls through ctypes are refused too and the namespace is tried first.
"""

import json
import os
import resource
import sys
import traceback

_CLONE_NEWNET = 0x40000000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# audit events whose first (and for the two-path ones, second) argument is a path being changed
_ONE_PATH = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
             "shutil.rmtree", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr"}
_TWO_PATHS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
              "shutil.move"}
_SPAWN = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.startfile",
          "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym",
          "ctypes.call_function"}


def _limit(cpu_s: int, memory_bytes: int, output_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _own_network() -> bool:
    """A network namespace of our own (only a down loopback in it); False where not permitted."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        return False


def _guard(root: str) -> None:
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
    # a fixed file name (not the temp dir's path): tracebacks read the same in every run
    code = compile(source, os.path.basename(job["program"]), "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})


def _load_module(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tools_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _call(job: dict) -> None:
    fn = getattr(_load_module(job["module"]), job["function"], None)
    if not callable(fn):
        raise LookupError(f"no tool function {job['function']!r} in {job['module']}")
    value = fn(**job["arguments"])
    with open(job["result"], "w", encoding="utf-8") as f:
        json.dump({"value": value if isinstance(value, str) else json.dumps(value, default=str)}, f)


def _describe(job: dict) -> None:
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
    with open(job["result"], "w", encoding="utf-8") as f:
        json.dump(tools, f)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    _limit(job["cpu_s"], job["memory_bytes"], job["output_bytes"])
    isolated = _own_network() if job["unshare_network"] else False
    sys.dont_write_bytecode = True
    _guard(os.getcwd())
    if job.get("report_isolation"):
        print(f"network namespace: {isolated}", file=sys.stderr)
    run = {"program": _run_program, "call": _call, "describe": _describe}[job["mode"]]
    try:
        run(job)
    except SystemExit:
        raise
    except BaseException as e:
        _print_user_traceback(e)
        os._exit(1)


def _print_user_traceback(e: BaseException) -> None:
    """The traceback without this file's frames (the same text in every run and checkout)."""
    te = traceback.TracebackException.from_exception(e)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if os.path.abspath(f.filename) != os.path.abspath(__file__)])
    sys.stdout.flush()
    sys.stderr.write("".join(te.format()))
    sys.stderr.flush()


if __name__ == "__main__":
    main()
