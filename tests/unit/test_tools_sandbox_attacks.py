"""The sandbox against code that attacks it (issue #42): each attack the issue lists, and more
hostile programs. Most first switch the audit hook off from inside (UNHOOK, as the issue did):
what is tested is the OS boundary behind it. Nothing may be written, read back or reached outside,
the engine's process lives, nothing outlives the call, the work dir's size is capped, and every
outcome is a ToolResult. Attacks that could kill the engine run it in a subprocess of its own."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from flexlamps.tools.sandbox import Limits, call_function, run_program
from tests.conftest import REPO

FAST = Limits(wall_s=120, cpu_s=5)
# the audit hook's refusals become no-ops (its `refuse` function found through gc, its code replaced)
UNHOOK = textwrap.dedent("""
    import gc, os, sys
    for _f in gc.get_objects():
        if getattr(_f, "__name__", None) == "refuse" and callable(_f):
            _f.__code__ = (lambda what: None).__code__
""")
LIBC = "import ctypes\nlibc = ctypes.CDLL('libc.so.6', use_errno=True)\n"


def _run(body: str, limits: Limits = FAST, prelude: str = ""):
    return run_program(UNHOOK + prelude + textwrap.dedent(body), limits)


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _in_engine_subprocess(body: str, env: dict | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """Run `body` through run_program in an engine of its own (a child python); its stdout ends in
    'engine alive <status>' when the engine came through."""
    script = (f"import json, os\nfrom flexlamps.tools.sandbox import Limits, run_program\n"
              f"res = run_program({(UNHOOK + prelude + textwrap.dedent(body))!r}.replace('ENGINE_PID', str(os.getpid())), "
              f"Limits(wall_s=60, cpu_s=5))\n"
              f"print(json.dumps(res.output))\nprint('engine alive', res.status, os.getpriority(os.PRIO_PROCESS, 0))")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_fork_exec_without_an_audit_event_runs_no_root_shell_and_nothing_outlives_the_call(tmp_path):
    marker = "987654.321"
    res = run_program(textwrap.dedent(f"""
        import _posixsubprocess, os
        r, w = os.pipe()
        args = [b"/bin/sh", b"-c", b"id -u; setsid sleep {marker} & touch {tmp_path}/escape; echo done"]
        pid = _posixsubprocess.fork_exec(args, [args[0]], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w,
                                         True, True, -1, None, None, None, -1, None, False)
        os.waitpid(pid, 0)
    """), FAST)
    assert res.ok, res
    assert res.output.split()[0] != "0"  # not root
    assert not (tmp_path / "escape").exists()
    time.sleep(0.5)
    assert _processes_with(marker) == []


def test_processes_started_in_a_new_session_die_with_the_call():
    marker = "876543.21"
    res = _run(f"""
        import subprocess
        for _ in range(3):
            subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", "{marker}"])
    """)
    assert res.ok, res
    assert _processes_with(marker) == []
    res = _run(f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
               "import time\ntime.sleep(60)", Limits(wall_s=2, cpu_s=5))
    assert res.status == "timeout"
    assert _processes_with(marker) == []


def test_writes_anywhere_are_impossible_with_the_hook_off(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    res = _run(f"""
        import shutil
        os.path.realpath = lambda p, *a, **k: os.getcwd()  # the other way in: the hook's path check
        for attempt in ["open({str(tmp_path / 'escape')!r}, 'w').write('x')",
                        "assert os.system('echo x > {tmp_path}/escape2') == 0",
                        "os.remove({str(keep)!r})",
                        "shutil.rmtree({str(tmp_path)!r})",
                        "open('/usr/escape', 'w')",
                        "open('/escape', 'w')",
                        "open('/dev/shm/escape', 'w')"]:
            try:
                exec(attempt)
                print("did", attempt)
            except (OSError, AssertionError) as e:
                print("refused", type(e).__name__)
    """)
    assert res.ok and "did" not in res.output, res.output
    assert keep.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["keep.txt"]


def test_dir_fd_forms_reach_nothing_outside(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    res = _run(f"""
        for attempt in ["os.open('escape', os.O_CREAT | os.O_WRONLY, dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))",
                        "os.remove('keep.txt', dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))",
                        "os.rename('mine', 'x', dst_dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY))",
                        "os.link('shadow', 'shadow', src_dir_fd=os.open('/etc', os.O_RDONLY))",
                        "os.link('python3', 'py', src_dir_fd=os.open('/usr/bin', os.O_RDONLY))",
                        "os.open('escape', os.O_CREAT | os.O_WRONLY, dir_fd=os.open('/usr', os.O_RDONLY))"]:
            try:
                exec(attempt)
                print("did", attempt)
            except OSError as e:
                print("refused", type(e).__name__)
    """)
    assert res.ok and "did os.open" not in res.output and "did os.remove" not in res.output, res.output
    assert keep.read_text() == "mine" and sorted(os.listdir(tmp_path)) == ["keep.txt"]


def test_fifos_nodes_and_databases_are_not_made_outside(tmp_path):
    res = _run(f"""
        import sqlite3
        for attempt in ["os.mkfifo({str(tmp_path / 'fifo')!r})", "os.mknod({str(tmp_path / 'node')!r})",
                        "sqlite3.connect({str(tmp_path / 'db.sqlite')!r}).execute('create table t (x)')",
                        "os.mknod('/sandbox/disk', 0o600 | 0o60000, os.makedev(8, 0))"]:
            try:
                exec(attempt)
                print("did", attempt)
            except (OSError, sqlite3.Error) as e:
                print("refused", type(e).__name__)
    """)
    assert res.ok and "did" not in res.output, res.output
    assert os.listdir(tmp_path) == []


def test_the_engine_cannot_be_killed_or_reniced():
    """The program tries its parent, the engine's pid (it is told it) and every pid it sees."""
    done = _in_engine_subprocess("""
        import signal
        for target in (os.getppid(), ENGINE_PID):
            for attempt in ["signal.pidfd_send_signal(os.pidfd_open(target), signal.SIGKILL)",
                            "os.setpriority(os.PRIO_PROCESS, target, 19)", "os.kill(target, signal.SIGKILL)"]:
                try:
                    exec(attempt)
                    print("did", attempt, target)
                except OSError as e:
                    print("refused", type(e).__name__)
    """)
    assert done.returncode == 0 and "engine alive" in done.stdout, (done.stdout, done.stderr)
    assert done.stdout.split()[-1] == str(os.getpriority(os.PRIO_PROCESS, 0))  # the engine's niceness kept


def test_secrets_of_the_machine_and_the_engine_are_not_readable():
    done = _in_engine_subprocess(f"""
        for path in ["/etc/shadow", "/etc/passwd", {str(REPO / 'setup.cfg')!r}, "/proc/ENGINE_PID/environ",
                     "/proc/ENGINE_PID/cmdline", "/root/.bashrc", "/home"]:
            try:
                print(open(path, errors="replace").read() if os.path.isfile(path) else os.listdir(path))
            except OSError as e:
                print("refused", type(e).__name__)
        print(sorted(os.environ))
    """, env={"FLEXLAMPS_TEST_SECRET": "s3cr3t-token"})
    assert done.returncode == 0 and "engine alive ok" in done.stdout, (done.stdout, done.stderr)
    output = json.loads(done.stdout.splitlines()[-2])
    assert "s3cr3t-token" not in output and "FLEXLAMPS_TEST_SECRET" not in output
    assert "root:" not in output and "install_requires" not in output and "refused" in output


def test_a_tool_that_forges_or_wrecks_its_result_gives_an_error_result(tmp_path):
    module = tmp_path / "tools.py"
    module.write_text(textwrap.dedent("""
        import os

        def _garbage():
            open(".tool_result.json", "w").write("{}")
            for fd in range(3, 64):
                try:
                    os.write(fd, b'{"nonce": "00", "value": "forged"}\\n garbage {')
                except OSError:
                    pass

        def forge():
            _garbage()
            os._exit(0)

        def wreck():
            _garbage()
            return "real"

        def vanish():
            os.abort()
    """))
    forged = call_function(module, "forge", {}, FAST)
    assert forged.status == "exited" and forged.value is None and "no valid result" in forged.output
    assert call_function(module, "wreck", {}, FAST).value == "real"  # its own result still comes through
    assert call_function(module, "vanish", {}, FAST).status == "killed"


def test_a_program_that_deletes_or_truncates_its_output_gives_a_result():
    res = _run("""
        print("before")
        for attempt in ["os.remove('../output.txt')", "os.remove('output.txt', dir_fd=os.open('..', os.O_RDONLY))",
                        "os.ftruncate(1, 0)", "os.close(1); os.close(2)"]:
            try:
                exec(attempt)
            except OSError:
                pass
    """)
    assert res.ok, res


@pytest.mark.parametrize("early_exit", ["exit(0)", "import sys\nsys.exit()", "import os\nos._exit(0)",
                                        "raise SystemExit", "import os\nos.abort()",
                                        "quit()"])
def test_a_program_that_ends_before_its_tests_fails(early_exit):
    program = f"def add(a, b):\n    return a - b\n\n{early_exit}\n\n\ndef check(c):\n    assert c(1, 2) == 3\n\n\ncheck(add)\n"
    res = run_program(program, FAST)
    assert not res.ok and res.status in ("exited", "killed"), res
    assert res.text().startswith("error")
    if res.status == "exited":
        assert "before it ran to its end" in res.text()


def test_the_work_dir_total_size_is_capped():
    res = _run("""
        written = 0
        try:
            for n in range(300):
                with open(f"f{n}", "wb") as f:
                    f.write(b"x" * (60 << 10))
                written += 1
        except OSError as e:
            print(type(e).__name__, e.errno)
        print("files", written)
    """, Limits(wall_s=120, cpu_s=5, disk_bytes=4 << 20))
    assert res.ok and "OSError 28" in res.output, res  # ENOSPC
    assert int(res.output.split()[-1]) < 70  # 4 MiB of 60 KiB files


def test_the_host_loopback_is_unreachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        res = _run(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
                print("connected")
            except OSError as e:
                print("refused", type(e).__name__)
        """)
        with pytest.raises(socket.timeout):
            server.accept()
    assert res.ok and "refused" in res.output, res


def test_the_host_network_namespace_cannot_be_joined():
    done = _in_engine_subprocess(prelude=LIBC, body="""
        for path in ["/proc/ENGINE_PID/ns/net", f"/proc/{os.getppid()}/ns/net", "/proc/1/ns/net", "/proc/self/ns/net"]:
            try:
                fd = os.open(path, os.O_RDONLY)
                print("setns", libc.setns(fd, 0x40000000), ctypes.get_errno())
            except OSError as e:
                print("refused", type(e).__name__)
    """)
    assert "engine alive ok" in done.stdout, (done.stdout, done.stderr)
    output = json.loads(done.stdout.splitlines()[-2])
    assert "setns 0" not in output and "setns -1 1" in output  # EPERM: seccomp


def test_the_seccomp_filter_refuses_the_kernel_s_dangerous_calls():
    res = _run(prelude=LIBC, body="""
        calls = {"unshare(CLONE_NEWUSER)": (272, 0x10000000), "mount": (165, 0, 0, 0, 0, 0), "ptrace(TRACEME)": (101, 0),
                 "bpf": (321, 0, 0, 0), "keyctl": (250, 0), "perf_event_open": (298, 0, 0, 0, 0, 0),
                 "kexec_load": (246, 0, 0, 0, 0), "init_module": (175, 0, 0, 0), "userfaultfd": (323, 0),
                 "process_vm_readv": (310, 1, 0, 0, 0, 0, 0), "clone(CLONE_NEWNS)": (56, 0x00020000, 0, 0, 0, 0),
                 "clone3": (435, 0, 0), "io_uring_setup": (425, 1, 0), "pivot_root": (155, 0, 0)}
        for name, args in calls.items():
            print(name, libc.syscall(*args), ctypes.get_errno())
        print(open("/proc/self/status").read())
    """)
    assert res.ok, res
    rows = [line.rsplit(" ", 2) for line in res.output.splitlines()[:14]]
    results = {name: (int(rv), int(err)) for name, rv, err in rows}
    assert all(v == (-1, 1) for k, v in results.items() if k != "clone3"), results  # EPERM
    assert results["clone3"] == (-1, 38)  # ENOSYS: libc falls back to clone
    status = dict(line.split(":\t", 1) for line in res.output.splitlines() if ":\t" in line)
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2" and int(status["CapEff"], 16) == 0
    assert status["Uid"].split() == ["65534"] * 4


def test_on_the_host_the_child_is_no_privileged_user():
    """Seen from the host while it runs: nobody when the engine is root, else the engine's own user."""
    marker, outcome = "3.21987", {}
    run = threading.Thread(target=lambda: outcome.update(res=_run(f'os.execv("/bin/sleep", ["sleep", "{marker}"])')))
    run.start()
    try:
        deadline = time.monotonic() + 60
        while not (pids := _processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.02)
        with open(f"/proc/{pids[0]}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    finally:
        run.join()
    expected = 65534 if os.geteuid() == 0 else os.getuid()
    assert {int(u) for u in status["Uid"].split()} == {expected} != {0}
    assert {int(g) for g in status["Gid"].split()} == {65534 if os.geteuid() == 0 else os.getgid()}
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and status["NoNewPrivs"] == "1"
    assert outcome["res"].status == "exited"  # it never ran to its end


def test_proc_shows_only_the_sandbox_and_cannot_be_written():
    done = _in_engine_subprocess("""
        print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), os.path.exists("/proc/ENGINE_PID"))
        for path, text in [("/proc/sys/vm/drop_caches", "3"), ("/proc/sysrq-trigger", "b"),
                           ("/proc/self/oom_score_adj", "-1000"), ("/proc/1/comm", "x")]:
            try:
                with open(path, "w") as f:
                    f.write(text)
                print("did", path)
            except OSError as e:
                print("refused", type(e).__name__)
    """)
    assert "engine alive ok" in done.stdout, (done.stdout, done.stderr)
    output = json.loads(done.stdout.splitlines()[-2])
    pids, engine_seen = output.splitlines()[0].rsplit("] ", 1)
    assert max(json.loads(pids + "]")) < 10 and engine_seen == "False"
    assert "did" not in output


def test_symlinks_in_the_work_dir_lead_nowhere(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t")
    res = _run(f"""
        for name, target in [("a", {str(secret)!r}), ("b", "/etc/shadow"), ("c", "/proc/1/root/etc/shadow"),
                             ("d", "/proc/self/cwd/../../root")]:
            try:
                os.symlink(target, name)
                print(open(name).read())
            except OSError as e:
                print("refused", type(e).__name__)
    """)
    assert res.ok and "s3cr3t" not in res.output and res.output.count("refused") == 4, res


def test_a_fork_bomb_is_capped_and_leaves_nothing():
    res = _run("""
        import time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(876.5)
                    os._exit(0)
                children += 1
        except OSError as e:
            print("stopped", type(e).__name__, "after", children)
    """, Limits(wall_s=60, cpu_s=5, processes=8))
    assert res.ok and "stopped BlockingIOError after" in res.output, res
    assert int(res.output.split()[-1]) < 8
    assert _processes_with("876.5") == []


def test_killing_every_process_it_can_reaches_only_the_sandbox():
    done = _in_engine_subprocess("""
        import signal
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError as e:
            print("refused", type(e).__name__)
    """)
    assert "engine alive" in done.stdout, (done.stdout, done.stderr)
