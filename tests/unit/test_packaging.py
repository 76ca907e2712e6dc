"""What the wheel holds and how the command starts, checked without building a wheel
(scripts/check_wheel.sh, run by .ci/run, installs the real one outside the checkout)."""

import configparser
import os
import subprocess
import sys

from flexlamps.cli import SUBCOMMANDS, main
from tests.conftest import REPO


def _package_data() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return {package: [p.strip() for p in patterns.replace("\n", ",").split(",") if p.strip()]
            for package, patterns in cfg["options.package_data"].items()}


def test_every_c_source_and_header_ships_in_the_wheel():
    shipped = {(REPO / package.replace(".", "/")).glob(pattern) for package, patterns in _package_data().items()
               for pattern in patterns}
    shipped = {path.resolve() for paths in shipped for path in paths}
    sources = {p.resolve() for root in ("flexlamps", "quant", "offload", "placement")
               for ext in ("*.c", "*.h") for p in (REPO / root).rglob(ext)}
    assert sources and sources <= shipped, sorted(map(str, sources - shipped))


def test_every_registered_command_exists():
    assert main.list_commands(None) == sorted(SUBCOMMANDS)
    for name in SUBCOMMANDS:
        assert main.get_command(None, name) is not None, name


def test_python_m_flexlamps_ignores_folders_named_like_our_packages(tmp_path):
    """`python -m` puts the working directory first on sys.path: a user's `offload/`, `quant/` or
    `placement/` there (a package or a plain folder) must not be imported instead of ours."""
    for name in ("offload", "quant", "placement"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text('raise ImportError("the user\'s folder was imported")\n')
    (tmp_path / "offload" / "flexlamps-offload").mkdir()  # what --offload-dir offload leaves
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "flexlamps", "plan", "--model", "opt-6.7b", "--hardware",
                           "t4-flexgen", "--prompt-len", "64", "--gen-len", "8"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_size_option_reads_sizes_with_the_one_parser():
    """--gpu-mem, --cpu-mem and the pools' sizes: ByteSize (placement.parse_bytes) in every command."""
    from flexlamps.commands.options import ByteSize

    sizes = {(name, p.opts[0]): p.type for name in SUBCOMMANDS for p in main.get_command(None, name).params
             if p.opts[0].endswith("-mem")}
    assert ("agents", "--gpu-mem") in sizes and ("profile", "--gpu-mem") in sizes
    assert all(isinstance(t, ByteSize) for t in sizes.values()), sizes
