"""Every line of README.md's code blocks runs as written, and the README stays a quick start.

Fast: each `flexlamps` line's arguments are parsed by the command itself (required options,
choices, ranges, files that must exist), so a line that would exit 2 fails here; every line is a
command a newcomer can paste (`.venv/bin/` before `flexlamps`); the test command is .ci/run's; the
models table is the registry's; the README has at most 150 lines and its links resolve. Slow: each
line runs for real, and so does the Python example, in a copy of the checkout set up by the
README's first command alone (`bash scripts/setup.sh`, no test extras; ../shared/ linked beside it).
"""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from flexlamps.cli import main
from tests.conftest import REPO, SHARED_DATA


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


def _newcomer_env() -> dict:
    """This process's environment without what points Python at the test run's own packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


@pytest.fixture(scope="session")
def first_setup(tmp_path_factory) -> Path:
    """A copy of the checkout (the files git would commit) set up by the README's first set-up
    command alone, `bash scripts/setup.sh` (no test extras): what a newcomer's lines run in, so a
    package a command needs but the set-up does not install fails here. pip's cache and the local
    wheels the test set-up left keep it to a few minutes."""
    root = tmp_path_factory.mktemp("readme_setup") / "repo"
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    if SHARED_DATA.exists():  # the benchmark data beside the checkout (../shared/data)
        (root.parent / "shared").mkdir()
        (root.parent / "shared" / "data").symlink_to(SHARED_DATA)
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=root, env=_newcomer_env(), capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, f"bash scripts/setup.sh\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return root


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("line", LINES)
def test_readme_line_runs(line, first_setup):
    """Each `flexlamps` line, as written, in the checkout set up by the README's first command."""
    argv = shlex.split(line)
    if missing := _missing_inputs(argv, first_setup):
        pytest.skip(f"{missing} not present beside this checkout")
    proc = subprocess.run([str(first_setup / ".venv" / "bin" / "flexlamps"), *argv[1:]], cwd=first_setup,
                          env=_newcomer_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"{line}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("code", PYTHON_BLOCKS)
def test_readme_python_runs(code, first_setup, tmp_path):
    proc = subprocess.run([str(first_setup / ".venv" / "bin" / "python"), "-c", code], cwd=tmp_path,
                          env=_newcomer_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
