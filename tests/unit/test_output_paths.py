"""Paths a run writes: folders checked by a real write, lock files that name a holder and are
gone after the run, outputs whose permissions follow the umask."""

import os
import stat

import pytest

from flexlamps.io.atomic import atomic_output
from offload.folders import UnusablePathError, make_writable_folder
from offload.lock import PathInUseError, PathLock


def test_a_folder_under_a_file_names_the_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UnusablePathError, match=r"--out .*f is a file, not a folder; choose another --out"):
        make_writable_folder(tmp_path / "f" / "sub", "--out")
    with pytest.raises(UnusablePathError, match="is a file, not a folder"):
        make_writable_folder(tmp_path / "f", "--out")


def test_a_folder_the_kernel_refuses_is_named_even_for_root():
    """os.access says yes to root under /proc; the probe's real write says no."""
    with pytest.raises(UnusablePathError, match="--offload-dir /proc/x: cannot"):
        make_writable_folder("/proc/x", "--offload-dir")


def test_lock_files_are_removed_on_release_and_the_path_taken_again(tmp_path):
    out = tmp_path / "out.jsonl"
    first = PathLock(out, "--out").acquire()
    assert (tmp_path / "out.jsonl.lock").exists() and (tmp_path / "out.jsonl.lock.owner").exists()
    with pytest.raises(PathInUseError, match=f"--out {out} is in use by process {os.getpid()}"):
        PathLock(out, "--out").acquire()
    first.release()
    assert list(tmp_path.iterdir()) == []
    with PathLock(out, "--out"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_lock_under_an_unwritable_folder_is_not_called_in_use(tmp_path):
    (tmp_path / "f").write_text("x")
    for base in (tmp_path / "f" / "out.jsonl", "/proc/out.jsonl"):
        with pytest.raises(UnusablePathError, match="choose another --out"):
            PathLock(base, "--out").acquire()


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with atomic_output(tmp_path / "summary.json") as f:
            f.write("{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_output_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_output(path) as f:
            f.write("new")
            raise RuntimeError("disk gone")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
