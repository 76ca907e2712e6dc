"""Standard output that cannot be written (a full disk, `> /dev/full`) ends a command in one line,
not a traceback; a closed pipe (`| head`) still ends quietly, as click makes it."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _flexlamps(args, stdout):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "flexlamps", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=REPO, timeout=120)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["models", "--markdown"], ["models"]])
def test_a_full_stdout_is_one_line(args):
    with open("/dev/full", "w") as full:
        proc = _flexlamps(args, full)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["Error: cannot write to standard output (No space left on device)"]


def test_a_closed_pipe_is_quiet():
    proc = subprocess.Popen([sys.executable, "-m", "flexlamps", "models", "--markdown"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    assert "Traceback" not in proc.stderr.read().decode() and proc.wait(timeout=120) in (0, 1)
