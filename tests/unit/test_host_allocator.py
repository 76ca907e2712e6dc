"""The allocator tuning applies on glibc Linux and can be switched off."""

import os
import subprocess
import sys

import pytest

CODE = "from flexlamps.host_allocator import keep_freed_memory; print(keep_freed_memory())"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("setting,expected", [("1", "True"), ("0", "False")])
def test_keep_freed_memory_applies_unless_switched_off(setting, expected):
    env = dict(os.environ, FLEXLAMPS_KEEP_FREED_MEMORY=setting)
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
