"""`flexlamps env`: versions, CPU, GPU, each native kernel's state and why, cache and profile."""

import json

from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.kernels import build, loader, variants

# every variant's flags but AMX-BF16's (with them the int8 GEMM is left to oneDNN): each kernel but half_amx
# is tried in its highest variant
AMX_BF16 = {"amx_bf16", "avx512_bf16"}
EVERY_FLAG = sorted({f for n in loader.NAMES for v in loader.kernel_spec(n).variants for f in v.cpu_flags} - AMX_BF16)


def test_env_reports_every_kernel_and_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    monkeypatch.setenv(loader.SWITCH_ENV, "0")
    monkeypatch.setattr(loader, "chosen", lambda: loader.Kernels(tmp_path / "kernels"))
    result = CliRunner().invoke(main, ["env", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    kernels = report["native kernels"]
    assert kernels.pop("cpu variant") in (*variants.LEVELS, variants.BELOW_BASELINE)
    assert kernels == {n: {"state": "disabled", "variant": None, "why": "$FLEXLAMPS_NATIVE_KERNELS=0"}
                       for n in loader.NAMES}
    assert report["cache folder"] == str(tmp_path) and report["hardware profile"].startswith(str(tmp_path))
    assert report["torch"] and report["flexlamps"].startswith("0.") and "transformers" in report
    assert set(report["cpu"]) == {"model", "cores", "features", "lacks"} and report["gpu"]
    text = CliRunner().invoke(main, ["env"]).output
    assert all(f"  {name}" in text for name in loader.NAMES) and "cache folder: " in text


def test_env_names_a_kernel_that_failed_and_why(monkeypatch, tmp_path):
    kernels = loader.Kernels(tmp_path)
    kernels._outcomes = {n: loader.Outcome(None, "failed", "KernelCheckError: boom", "avx2") for n in loader.NAMES}
    monkeypatch.setattr(loader, "chosen", lambda: kernels)
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 0 and "tile_gemv    failed (avx2): KernelCheckError: boom" in result.output


def test_env_prints_each_kernel_failure_once(tmp_path, failing_compiler):
    """A kernel that fails to build is its env line, not also the loader's raw warning."""
    import os
    import subprocess
    import sys

    code = ("from flexlamps.kernels import build\n"
            f"build.cpu_flags = lambda cpuinfo=None: {EVERY_FLAG!r}  # every kernel is tried\n"
            "from flexlamps.cli import main\n"
            "main(['env'], prog_name='flexlamps')\n")
    env = {**os.environ, "FLEXLAMPS_CACHE": str(tmp_path / "cache"), "CC": str(failing_compiler),
           loader.SWITCH_ENV: "1", "PYTHONWARNINGS": "default"}
    env.pop(variants.VARIANT_ENV, None)  # every kernel at the (faked) CPU's best: avx512
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tried = [n for n in loader.NAMES if n != "half_amx"]
    # (tile_gemv's: amx; avx_vnni where torch is capped at AVX2, whose int4 tiles amx does not take)
    tops = [loader.offered(loader.kernel_spec(n))[-1].level for n in tried]
    assert all(proc.stdout.count(f"{n:<12} failed ({top}): CalledProcessError: error: boom") == 1
               for n, top in zip(tried, tops)), proc.stdout
    assert proc.stdout.count("half_amx     disabled: this CPU lacks amx_bf16 avx512_bf16") == 1, proc.stdout
    assert "boom" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr


def test_env_flags_a_cache_folder_that_is_a_file(monkeypatch, tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    for root, words in ((tmp_path / "cache", "a file, not a folder"), (tmp_path / "cache" / "sub", "which is a file")):
        monkeypatch.setenv("FLEXLAMPS_CACHE", str(root))
        monkeypatch.setenv(loader.SWITCH_ENV, "0")
        monkeypatch.setattr(loader, "chosen", lambda: loader.Kernels(root / "kernels"))
        result = CliRunner().invoke(main, ["env"])
        assert result.exit_code == 0, result.output
        line = next(ln for ln in result.output.splitlines() if ln.startswith("cache folder: "))
        assert words in line and "set $FLEXLAMPS_CACHE to a folder" in line, line


def test_env_names_each_kernels_variant_and_a_cpu_below_avx2_in_one_line(monkeypatch, tmp_path):
    monkeypatch.delenv(variants.VARIANT_ENV, raising=False)
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: ["fpu", "sse2"])
    monkeypatch.setattr(loader, "chosen", lambda: loader.Kernels(tmp_path))
    text = CliRunner().invoke(main, ["env"]).output
    assert f"native kernels (cpu variant: {variants.BELOW_BASELINE}):" in text
    assert f"  tile_gemv    disabled: {variants.BELOW_BASELINE}" in text
    kernels = loader.Kernels(tmp_path)
    kernels._outcomes = {n: loader.Outcome(object(), "loaded", "built and checked against torch", "avx2")
                         for n in loader.NAMES}
    monkeypatch.setattr(loader, "chosen", lambda: kernels)
    monkeypatch.setattr(build, "cpu_flags", lambda cpuinfo=None: ["avx2", "fma", "f16c"])
    text = CliRunner().invoke(main, ["env"]).output
    assert "native kernels (cpu variant: avx2):" in text and "  int8_gemm    loaded (avx2): built" in text
