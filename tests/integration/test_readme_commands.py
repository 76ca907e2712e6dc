"""Every line of README.md's code blocks runs as written, and the README stays a quick start.

Fast: each `flexlamps` line's arguments are parsed by the command itself (required options,
choices, ranges, files that must exist), so a line that would exit 2 fails here; every line is a
command a newcomer can paste (`.venv/bin/` before `flexlamps`); the test command is .ci/run's; the
models table is the registry's; the README has at most 150 lines and its links resolve. Slow: each
line runs for real from a copy of the repository's layout (examples/ and ../shared/ linked in a
temp folder), and so does the Python example.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from flexlamps.cli import main
from tests.conftest import REPO


def readme_command_lines() -> list[str]:
    """The flexlamps invocations inside README's fenced blocks (a `.venv/bin/` prefix and `&&`
    chains around them are split off)."""
    text = (REPO / "README.md").read_text()
    lines = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                part = part.strip().removeprefix(".venv/bin/")
                if part.startswith("flexlamps "):
                    lines.append(part)
    return lines


LINES = readme_command_lines()
README = (REPO / "README.md").read_text()
SHELL_BLOCKS = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", README, flags=re.S)
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_the_readme_is_a_quick_start():
    assert len(README.splitlines()) <= 150


def test_every_shell_line_runs_as_written_from_the_checkout():
    """After the set-up, `flexlamps` is not on the PATH: every line names .venv/bin/ or sets up."""
    for block in SHELL_BLOCKS:
        for line in filter(None, map(str.strip, block.splitlines())):
            for part in map(str.strip, line.split("&&")):
                assert part.startswith(("bash scripts/setup.sh", ".venv/bin/", "cat ")), line


def test_ci_runs_the_readmes_test_command():
    test_command = next(line for block in SHELL_BLOCKS for line in block.splitlines() if "pytest" in line)
    assert test_command.strip() in (REPO / ".ci" / "run").read_text().splitlines()


def test_the_models_table_is_the_registrys():
    from flexlamps.commands.models import markdown_table

    assert markdown_table() in README, ("README's models table is stale: replace it (below the line naming "
                                        "`flexlamps models --markdown`) by that command's output")


def test_every_link_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert links and all((REPO / link).is_file() for link in links), links


def _workdir(tmp_path: Path) -> Path:
    """A folder where the README's relative paths resolve as in a checkout."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "examples").symlink_to(REPO / "examples")
    if (REPO.parent / "shared").exists():
        (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    return repo


def _missing_inputs(argv: list[str], cwd: Path) -> list[str]:
    return [a for a in argv if "/" in a and a.endswith((".json", ".jsonl", ".jsonl.gz")) and a.startswith("..")
            and not (cwd / a).exists()]


def test_readme_has_command_lines():
    assert len(LINES) >= 6 and any(ln.startswith("flexlamps generate") for ln in LINES)


@pytest.mark.parametrize("line", LINES)
def test_readme_line_parses(line, tmp_path, monkeypatch):
    cwd = _workdir(tmp_path)
    monkeypatch.chdir(cwd)
    argv = shlex.split(line)[1:]
    if missing := _missing_inputs(argv, cwd):
        pytest.skip(f"{missing} not present beside this checkout")
    name, args = argv[0], argv[1:]
    command = main.get_command(click.Context(main), name)
    assert command is not None, f"README names an unknown command: {line}"
    # parsing runs every option's type check and callback (--threads sets torch's threads)
    command.make_context(name, list(args))


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("line", LINES)
def test_readme_line_runs(line, tmp_path):
    cwd = _workdir(tmp_path)
    argv = shlex.split(line)
    if missing := _missing_inputs(argv, cwd):
        pytest.skip(f"{missing} not present beside this checkout")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run([sys.executable, "-m", "flexlamps.cli", *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("code", PYTHON_BLOCKS)
def test_readme_python_runs(code, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
