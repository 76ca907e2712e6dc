"""`flexlamps env`: versions, CPU, GPU, each native kernel's state and why, cache and profile."""

import json

from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.kernels import loader


def test_env_reports_every_kernel_and_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    monkeypatch.setenv(loader.SWITCH_ENV, "0")
    monkeypatch.setattr(loader, "chosen", lambda: loader.Kernels(tmp_path / "kernels"))
    result = CliRunner().invoke(main, ["env", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["native kernels"] == {n: {"state": "disabled", "why": "$FLEXLAMPS_NATIVE_KERNELS=0"}
                                        for n in loader.NAMES}
    assert report["cache folder"] == str(tmp_path) and report["hardware profile"].startswith(str(tmp_path))
    assert report["torch"] and report["flexlamps"].startswith("0.") and "transformers" in report
    assert set(report["cpu"]) == {"model", "cores", "features", "lacks"} and report["gpu"]
    text = CliRunner().invoke(main, ["env"]).output
    assert all(f"  {name}" in text for name in loader.NAMES) and "cache folder: " in text


def test_env_names_a_kernel_that_failed_and_why(monkeypatch, tmp_path):
    kernels = loader.Kernels(tmp_path)
    kernels._outcomes = {n: loader.Outcome(None, "failed", "KernelCheckError: boom") for n in loader.NAMES}
    monkeypatch.setattr(loader, "chosen", lambda: kernels)
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 0 and "tile_gemv    failed: KernelCheckError: boom" in result.output
