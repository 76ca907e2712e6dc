"""The offload folder is owned explicitly: flexlamps writes only inside its marked subfolder,
deletes only files its index lists, locks it for one run, and reuses it before asking for room."""

import errno
import os
import subprocess
import sys
from collections import namedtuple

import pytest
import torch

from offload import DiskFolder, OffloadFolderError, PathInUseError
from offload import disk as disk_mod


def _build(root, fingerprint="fp", names=("a", "b")):
    folder = DiskFolder(root, fingerprint)
    folder.claim()
    reused = folder.try_reuse(set(names))
    folder.check_room(1 << 20, reused)
    if not reused:
        folder.clear()
        folder.begin(set(names))
        for k, name in enumerate(names):
            folder.write(name, torch.full((64,), float(k)))
        folder.commit()
    return folder, reused


def test_user_files_survive_build_and_rebuild(tmp_path):
    (tmp_path / "mydata.dat").write_text("x")
    (tmp_path / "index.json").write_text("{}")
    folder, reused = _build(tmp_path)
    folder.release()
    assert not reused
    folder, reused = _build(tmp_path, fingerprint="other")  # stale: rebuilt
    folder.release()
    assert not reused
    assert (tmp_path / "mydata.dat").read_text() == "x" and (tmp_path / "index.json").read_text() == "{}"
    folder, reused = _build(tmp_path, fingerprint="other")
    folder.release()
    assert reused


def test_unowned_subfolder_is_refused_naming_its_files(tmp_path):
    (tmp_path / "flexlamps-offload").mkdir()
    (tmp_path / "flexlamps-offload" / "notes.txt").write_text("mine")
    with pytest.raises(OffloadFolderError, match="notes.txt"):
        DiskFolder(tmp_path, "fp").claim()
    assert (tmp_path / "flexlamps-offload" / "notes.txt").read_text() == "mine"


def test_unlisted_file_in_our_subfolder_is_kept(tmp_path):
    folder, _ = _build(tmp_path)
    stray = folder.folder / "stray.dat"
    stray.write_text("keep")
    folder.clear()
    folder.release()
    assert stray.read_text() == "keep"
    assert not (folder.folder / "a.dat").exists()


def test_killed_write_leaves_an_index_that_deletes_exactly_its_files(tmp_path):
    folder = DiskFolder(tmp_path, "fp")
    folder.claim()
    folder.begin({"a", "b"})
    folder.write("a", torch.ones(8))  # killed here: b never written, index incomplete
    folder.release()
    again = DiskFolder(tmp_path, "fp")
    again.claim()
    assert not again.try_reuse({"a", "b"})
    again.clear()
    assert not (again.folder / "a.dat").exists()
    again.release()


def test_second_run_is_refused_naming_the_holder(tmp_path):
    folder, _ = _build(tmp_path)
    with pytest.raises(PathInUseError, match=f"process {os.getpid()}.*--offload-dir"):
        DiskFolder(tmp_path, "fp").claim()
    folder.release()
    DiskFolder(tmp_path, "fp").claim()  # free again


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    code = ("import sys, time; from offload import DiskFolder; d = DiskFolder(sys.argv[1], 'fp'); d.claim(); "
            "print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(PathInUseError, match=f"process {proc.pid}"):
            DiskFolder(tmp_path, "fp").claim()
    finally:
        proc.kill()
        proc.wait()
    folder = DiskFolder(tmp_path, "fp")
    folder.claim()
    folder.release()


def test_reuse_is_checked_before_free_space(tmp_path, monkeypatch):
    folder, _ = _build(tmp_path)
    folder.release()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_mod.shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 0))
    folder, reused = _build(tmp_path)  # needs 1 MiB, 0 free: fine, nothing new is written
    folder.release()
    assert reused
    with pytest.raises(OffloadFolderError, match="GiB free"):
        _build(tmp_path, fingerprint="changed")


def test_full_disk_names_the_folder_and_leaves_no_temp_file(tmp_path, monkeypatch):
    real_write = os.write

    def full(fd, data):
        if len(data) > 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    folder = DiskFolder(tmp_path, "fp")
    folder.claim()
    folder.begin({"big"})
    monkeypatch.setattr(disk_mod.os, "write", full)
    with pytest.raises(OffloadFolderError, match="disk filled up.*--offload-dir"):
        folder.write("big", torch.ones(1000))
    folder.release()
    assert sorted(p.name for p in folder.folder.iterdir() if not p.name.startswith(".")) == ["index.json"]


def _o_direct_works(folder) -> bool:
    probe = folder / "probe"
    probe.write_bytes(b"\0" * disk_mod.DIRECT_ALIGN)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


def test_aligned_reads_go_direct_and_the_rest_buffered_with_the_same_bits(tmp_path):
    """A page-aligned buffer, offset and length: read with O_DIRECT (where the file system has it),
    no page-cache copy; a buffer off the alignment, or rows of an odd width: a buffered read. The
    values are the ones written either way."""
    folder = DiskFolder(tmp_path, "fp")
    folder.claim()
    folder.begin({"big", "odd"})
    big = torch.randn(8, 1024)  # 4 KiB rows
    odd = torch.randn(5, 3)
    folder.write("big", big)
    folder.write("odd", odd)
    folder.commit()
    direct = _o_direct_works(tmp_path)
    out = disk_mod.aligned_empty((8, 1024), torch.float32)
    assert out.data_ptr() % disk_mod.DIRECT_ALIGN == 0
    assert torch.equal(folder.read_into("big", out), big)
    assert folder.reads == {"direct": int(direct), "buffered": int(not direct)}
    rows = disk_mod.aligned_empty((2, 1024), torch.float32)
    assert torch.equal(folder.read_rows_into("big", 3, rows), big[3:5])  # offset 3 rows: 12 KiB, aligned
    misaligned = torch.empty(8 * 1024 + 1)[1:].view(8, 1024)
    assert torch.equal(folder.read_into("big", misaligned), big)
    assert torch.equal(folder.read_into("odd", torch.empty(5, 3)), odd)
    assert folder.reads == {"direct": 2 * direct, "buffered": 2 + 2 * (not direct)}
    folder.release()
