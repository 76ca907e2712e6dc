"""A cached machine profile taken on a busy box is measured again once the box is quiet."""

import json

import pytest

from flexlamps.hardware import cache, machine
from placement import HardwareSpec, hardware_preset


def _cache(tmp_path, monkeypatch, check_flops):
    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    path = cache.profile_cache_path()
    path.write_text(hardware_preset("rtx4090").to_json())
    if check_flops is not None:
        path.with_name(path.stem + ".check.json").write_text(json.dumps({"gemm_flops": check_flops}))
    fresh = hardware_preset("t4")
    measured = []
    monkeypatch.setattr(machine, "profile_machine", lambda **kw: measured.append(kw) or fresh)
    # the quick GEMM check reads 1 GFLOP/s every time: two readings of a loaded box can differ by
    # more than STALE_PROFILE_SPEEDUP, which would decide these tests (the check itself runs in
    # test_the_check_reads_this_machine)
    monkeypatch.setattr(cache, "check_rate", lambda: 1e9)
    return path, fresh, measured


def test_a_profile_measured_under_load_is_measured_again(tmp_path, monkeypatch):
    path, fresh, measured = _cache(tmp_path, monkeypatch, check_flops=1.0)  # far slower than any CPU now
    told = []
    spec = cache.machine_profile(tmp_path / "scratch", lambda p, why: told.append(why))
    assert spec == fresh and len(measured) == 1
    assert "busy machine" in told[0]
    # the new profile and its check replace the old ones, so the next run uses them as they are
    assert HardwareSpec.from_json(path.read_text()) == fresh
    recorded = json.loads(path.with_name(path.stem + ".check.json").read_text())["gemm_flops"]
    assert recorded == 1e9
    assert cache.machine_profile(tmp_path / "scratch") == fresh and len(measured) == 1


def test_a_profile_checked_faster_than_now_is_kept(tmp_path, monkeypatch):
    _, _, measured = _cache(tmp_path, monkeypatch, check_flops=1e18)  # a busier box now: keep it
    assert cache.machine_profile(tmp_path / "scratch") == hardware_preset("rtx4090")
    assert measured == []


def test_a_profile_without_a_check_is_trusted(tmp_path, monkeypatch):
    _, _, measured = _cache(tmp_path, monkeypatch, check_flops=None)  # written by hand or an older flexlamps
    assert cache.machine_profile(tmp_path / "scratch") == hardware_preset("rtx4090")
    assert measured == []


def test_the_check_reads_this_machine():
    assert cache.check_rate() > 1e6  # FLOP/s of a 256 x 256 GEMM, however loaded the box


def test_the_read_bandwidth_probe_takes_a_median_and_refuses_nonsense():
    from flexlamps.hardware.probes import measure_read_bandwidth

    rate = measure_read_bandwidth(8 << 20, passes=3)
    assert 1e8 < rate < 1e13  # bytes/s: some real memory speed, not a division by ~0
    with pytest.raises(ValueError, match="passes 0"):
        measure_read_bandwidth(8 << 20, passes=0)
