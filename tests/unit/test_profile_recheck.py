"""A cached machine profile taken on a busy box is measured again once the box is quiet."""

import json
import os
import warnings

import pytest

from flexlamps.hardware import cache, machine
from placement import HardwareSpec, hardware_preset


QUIET, BUSY = 0.0, 1000.0  # load averages far below and far above the (patched) cores' worth


def _cache(tmp_path, monkeypatch, check_flops, check_load=None, load_now=QUIET):
    """A cached profile (rtx4090's) and its check (`check_load`: the load it records, None: none
    recorded, as an older flexlamps wrote it); the box's load average `load_now`, its cores 4."""
    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "usable_cores", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (load_now, load_now, load_now))
    path = cache.profile_cache_path()
    path.write_text(hardware_preset("rtx4090").to_json())
    if check_flops is not None:
        check = {"gemm_flops": check_flops, **({} if check_load is None else {"load": check_load, "cores": 4})}
        path.with_name(path.stem + ".check.json").write_text(json.dumps(check))
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


def _check(path) -> dict:
    return json.loads(path.with_name(path.stem + ".check.json").read_text())


def test_a_profile_measured_under_a_high_load_is_measured_again_once_the_box_is_quiet(tmp_path, monkeypatch):
    """The GEMM check agrees (1 GFLOP/s then and now), but the load recorded says the probes shared
    the cores: measured again, and the new check records the quiet load."""
    path, fresh, measured = _cache(tmp_path, monkeypatch, check_flops=1e9, check_load=BUSY)
    told = []
    assert cache.machine_profile(tmp_path / "scratch", lambda p, why: told.append(why)) == fresh
    assert len(measured) == 1 and "measured under load 1000.0 on 4 cores" in told[0]
    assert _check(path) == {"gemm_flops": 1e9, "load": QUIET, "cores": 4}
    assert cache.machine_profile(tmp_path / "scratch") == fresh and len(measured) == 1


def test_a_profile_measured_under_a_high_load_is_kept_with_a_warning_while_the_box_is_as_busy(tmp_path, monkeypatch):
    _, _, measured = _cache(tmp_path, monkeypatch, check_flops=1e9, check_load=BUSY, load_now=BUSY)
    with pytest.warns(UserWarning, match="measured under load 1000.0 on 4 cores") as caught:
        assert cache.machine_profile(tmp_path / "scratch") == hardware_preset("rtx4090")
    assert measured == [] and len(caught) == 1 and "\n" not in str(caught[0].message)  # one line


def test_a_profile_measured_under_a_low_load_is_kept_without_a_warning(tmp_path, monkeypatch):
    _, _, measured = _cache(tmp_path, monkeypatch, check_flops=1e9, check_load=QUIET, load_now=BUSY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.machine_profile(tmp_path / "scratch") == hardware_preset("rtx4090")
    assert measured == []


def test_measuring_under_a_high_load_warns_and_records_it(tmp_path, monkeypatch):
    """Measured on a busy box (nothing better to do), it says so and records the load, so the first
    run on a quieter box measures it again."""
    path, fresh, measured = _cache(tmp_path, monkeypatch, check_flops=None, load_now=BUSY)
    path.unlink()
    with pytest.warns(UserWarning, match="measuring the machine profile .* under load 1000.0 on 4 cores"):
        assert cache.machine_profile(tmp_path / "scratch") == fresh
    assert len(measured) == 1 and _check(path)["load"] == BUSY
    monkeypatch.setattr(os, "getloadavg", lambda: (QUIET, QUIET, QUIET))
    assert cache.machine_profile(tmp_path / "scratch") == fresh and len(measured) == 2


def test_contention_counts_this_process_threads_on_top_of_the_load(monkeypatch):
    monkeypatch.setattr(cache, "usable_cores", lambda: 2)
    monkeypatch.setattr(cache.torch, "get_num_threads", lambda: 1)
    assert cache.contention(0.0) == 0.5 and cache.contention(2.0) == 1.5  # at the bar: not yet busy
    assert cache.contention(2.2) > cache.BUSY_CONTENTION


def test_the_check_reads_this_machine():
    assert cache.check_rate() > 1e6  # FLOP/s of a 256 x 256 GEMM, however loaded the box


def test_the_read_bandwidth_probe_takes_a_median_and_refuses_nonsense():
    from flexlamps.hardware.probes import measure_read_bandwidth

    rate = measure_read_bandwidth(8 << 20, passes=3)
    assert 1e8 < rate < 1e13  # bytes/s: some real memory speed, not a division by ~0
    with pytest.raises(ValueError, match="passes 0"):
        measure_read_bandwidth(8 << 20, passes=0)
