"""A package a command's output needs that is not installed: a helm metric's (rouge-score) is one
line naming it before the model loads; matplotlib, which only draws the optional plots, is a note
and the run goes on. (The set-up installs rouge-score: test_readme_commands runs the README's
lines in a venv made by its first set-up command alone.)"""

import json
import sys

from click.testing import CliRunner

from flexlamps.cli import main
from tests.integration.test_sim_cli import _trace


def test_a_helm_metric_without_its_package_is_refused_before_the_model_loads(monkeypatch, tmp_path, no_model_load):
    monkeypatch.setitem(sys.modules, "rouge_score", None)  # as if not installed: its import fails
    res = CliRunner().invoke(main, ["helm", "--scenario", "demo", "--suite", "s", "--max-eval-instances", "4",
                                    "--output-path", str(tmp_path / "out")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.strip().splitlines() == [
        "Error: the metric rouge_l needs the rouge-score package, which is not installed: pip install rouge-score "
        "(a dependency of flexlamps: reinstall it with pip install .)"]


def test_simulate_without_matplotlib_writes_its_summary_and_says_why_no_plots(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["simulate", "--trace", _trace(tmp_path), "--policies", "fcfs", "--qps", "1",
                                    "--window", "10", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "note: no PNG plots: matplotlib is not installed (pip install 'flexlamps[plots]')" in res.output
    assert json.loads((out / "summary.json").read_text())["results"] and not list(out.glob("*.png"))
