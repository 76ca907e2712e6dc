"""The tool sandbox: whatever the code does, the caller gets a ToolResult saying so, in time."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import flexlamps.tools
from flexlamps.tools.sandbox import Limits, ToolResult, call_function, describe_tools, run_program

# programs that end on their own get a wall limit no load reaches (they take a fraction of a
# second; a loaded 2-core box may take seconds to start python); only the hang is cut at 1.5 s
FAST = Limits(wall_s=120, cpu_s=5)
HANG = Limits(wall_s=1.5, cpu_s=5)


def test_a_program_runs_in_its_own_temp_dir():
    res = run_program("import os\nopen('note.txt', 'w').write('hi')\nprint(open('note.txt').read(), os.getcwd())")
    assert res.ok  # cwd is the temp dir, shown as "."
    assert res.output.split() == ["hi", "."]
    assert res.seconds > 0


def test_a_hang_is_cut_at_the_wall_limit():
    start = time.perf_counter()
    res = run_program("import time\ntime.sleep(60)", HANG)
    assert res.status == "timeout"
    assert time.perf_counter() - start < 30  # cut, long before its 60 s sleep ends, however loaded the box
    assert 1.4 < res.seconds < 30
    assert "time limit" in res.text()


def test_a_busy_loop_is_cut_by_the_cpu_limit():
    res = run_program("while True:\n    pass", Limits(wall_s=300, cpu_s=1))  # 1 CPU second, however shared
    assert res.status == "cpu_limit" and "CPU-time" in res.text()


@pytest.mark.parametrize("source", [
    "import socket\nsocket.socket()",
    "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
    "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)",
])
def test_network_is_refused(source):
    res = run_program(source, FAST)
    assert res.status == "error"
    assert "network access" in res.output


def test_network_refused_even_with_the_namespace_off():
    res = run_program("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)", Limits(network=True))
    assert res.status == "error" and "socket.__new__" in res.output


def test_the_audit_hook_still_refuses_writes_outside_the_work_dir():
    """A second layer only (the boundary is the OS's: test_tools_sandbox_attacks.py)."""
    sources = ["open('/usr/escape', 'w').write('x')",
               "import os\nos.open('/usr/escape', os.O_CREAT | os.O_WRONLY)",
               "import os\nos.chdir('/usr')\nopen('escape', 'a')",
               "import os\nos.mkdir('/usr/escape')",
               "import os\nopen('a', 'w').close()\nos.rename('a', '/usr/escape')",
               "import os\nos.remove('/usr/bin/env')",
               "import shutil\nshutil.rmtree('/usr/lib')"]
    for source in sources:
        res = run_program(source, FAST)
        assert res.status == "error" and "outside the sandbox's temp dir" in res.output, (source, res)


def test_reading_is_allowed_and_processes_are_refused():
    assert run_program("import os\nprint(len(open(os.__file__).read()) > 0)").output.strip() == "True"
    for source in ("import subprocess\nsubprocess.run(['true'])", "import os\nos.system('true')",
                   "import os\nos.fork()", "import ctypes\nctypes.CDLL(None).getpid()"):
        res = run_program(source, FAST)
        assert res.status == "error" and "refused" in res.output, source


def test_crashes_and_exits_become_results():
    res = run_program("import os\nos.abort()", FAST)
    assert res.status == "killed" and res.text().startswith("error")
    res = run_program("import sys\nsys.exit(3)", FAST)
    assert res.status == "error" and "exit code 3" in res.output and "SystemExit: 3" in res.output
    res = run_program("def f():\n    assert 1 == 2, 'one is not two'\nf()", FAST)
    assert res.status == "error"
    # the traceback names program.py (not the temp dir) and none of the sandbox's own frames
    assert 'File "program.py", line 2, in f' in res.output and "_child.py" not in res.output
    assert res.output.rstrip().endswith("(exit code 1)") and "AssertionError: one is not two" in res.output


def test_output_and_memory_are_capped():
    res = run_program("print('x' * 10_000_000)", Limits(output_bytes=4096))
    assert res.status == "output_limit" and len(res.output) <= 4096
    assert len(res.text(100)) == 100
    res = run_program("x = bytearray(900 * 2**20)\nprint('allocated')", Limits(memory_bytes=256 << 20))
    assert res.status == "error" and "MemoryError" in res.output


def test_tool_functions_are_called_and_described(tmp_path):
    module = tmp_path / "tools.py"
    module.write_text(textwrap.dedent('''
        import socket

        def add(a: int, b: int = 1):
            """Add two numbers."""
            return a + b

        def shout(text: str):
            return text.upper()

        def dial():
            socket.socket()

        def _hidden():
            pass
    '''))
    names = [t["name"] for t in describe_tools(module)]
    assert names == ["add", "shout", "dial"]
    add = describe_tools(module)[0]
    assert add["description"] == "Add two numbers."
    assert add["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert add["parameters"]["required"] == ["a"]
    assert call_function(module, "add", {"a": 2, "b": 3}).value == "5"
    assert call_function(module, "shout", {"text": "hi"}).text() == "HI"
    assert "network access" in call_function(module, "dial", {}, FAST).text()
    missing = call_function(module, "nope", {}, FAST)
    assert missing.status == "error" and "no tool function 'nope'" in missing.text()
    assert "unexpected keyword" in call_function(module, "add", {"c": 1}, FAST).text()


def test_limits_are_checked():
    with pytest.raises(ValueError, match="sandbox limits too small"):
        Limits(wall_s=0)
    assert ToolResult("ok", "out", 0.1).text() == "out"


def _nobody_can_run(python: str) -> bool:
    try:
        return subprocess.run([python, "-I", "-c", "pass"], user=65534, group=65534, extra_groups=[],
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="run as root: it checks the sandbox as an unprivileged user")
def test_the_sandbox_works_for_a_user_without_root():
    """Users run flexlamps without root: there bwrap maps the sandbox's uid to theirs (bwrap.py)."""
    import pyseccomp

    python = next((p for p in (os.path.realpath(sys.executable), "/usr/bin/python3") if _nobody_can_run(p)), None)
    if python is None:
        pytest.skip("no Python here that an unprivileged user can run")
    folder = tempfile.mkdtemp()  # under /tmp, outside root's folders: copies of the sandbox and pyseccomp
    try:
        shutil.copytree(Path(flexlamps.tools.__file__).parent, Path(folder, "flexlamps", "tools"))
        Path(folder, "flexlamps", "__init__.py").write_text("")
        shutil.copy(pyseccomp.__file__, folder)
        subprocess.run(["chmod", "-R", "a+rX", folder], check=True)
        script = (f"import sys; sys.path.insert(0, {folder!r})\n"
                  "from flexlamps.tools.sandbox import boundary_problem, run_program\n"
                  "print(boundary_problem(), run_program('print(6 * 7)').output.strip(), run_program('exit(0)').status)")
        done = subprocess.run([python, "-I", "-c", script], user=65534, group=65534, extra_groups=[], cwd=folder,
                              env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(folder)
    assert done.stdout.split() == ["None", "42", "exited"], (done.stdout, done.stderr)


def _tool_dirs() -> set[str]:
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("flexlamps-tool-")}


def test_without_bubblewrap_calls_are_refused_unless_unsafe(monkeypatch):
    from flexlamps.tools import bwrap, sandbox

    monkeypatch.setattr(bwrap, "executable", lambda: None)
    sandbox.boundary_problem.cache_clear()
    try:
        assert "apt-get install bubblewrap" in sandbox.boundary_problem()
        with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
            run_program("pass", FAST)
        before = _tool_dirs()
        assert run_program("print(1)", Limits(wall_s=120, unsafe=True)).output == "1\n"
        assert run_program("exit(0)", Limits(wall_s=120, unsafe=True)).status == "exited"
        assert run_program("import time\ntime.sleep(60)", Limits(wall_s=1, unsafe=True)).status == "timeout"
        assert _tool_dirs() - before == set()  # its temp dirs are gone
    finally:
        sandbox.boundary_problem.cache_clear()


def test_calls_leave_no_descriptor_open():
    run_program("pass", FAST)
    before = sorted(os.listdir("/proc/self/fd"))
    for source in ("pass", "exit(0)", "import os\nos.abort()"):
        run_program(source, FAST)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_bubblewrap_that_cannot_start_is_named_in_the_refusal(monkeypatch):
    from flexlamps.tools import bwrap, sandbox

    command = bwrap.command
    monkeypatch.setattr(bwrap, "command", lambda *a: [*command(*a)[:1], "--no-such-option", *command(*a)[1:]])
    sandbox.boundary_problem.cache_clear()
    try:
        problem = sandbox.boundary_problem()
    finally:
        sandbox.boundary_problem.cache_clear()
    assert "cannot make a sandbox here (bwrap: Unknown option --no-such-option)" in problem
    assert len(problem.splitlines()) == 1
