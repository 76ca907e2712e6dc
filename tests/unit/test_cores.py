"""The cores this process may use and those other processes leave free (`flexlamps.cores`), one
torch-free home for the commands' thread count and the machine profile's load check."""

import os
import subprocess
import sys

from flexlamps import cores
from tests.conftest import REPO


def test_free_cores_are_the_usable_ones_less_the_load_at_least_one(monkeypatch):
    monkeypatch.setattr(cores, "usable_cores", lambda: 4)
    for load, free in ((0.0, 4), (1.4, 3), (2.6, 1), (9.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert cores.free_cores() == free


def test_the_commands_thread_count_reads_it_without_torch():
    code = "import sys, flexlamps.commands.options; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
