"""One cache variable: $FLEXLAMPS_CACHE holds every cache; the old $FLEXLAMPS_CACHE_DIR still works, with a warning."""

import warnings
from pathlib import Path

import pytest

from flexlamps.hardware.cache import profile_cache_path
from flexlamps.cache_folder import cache_root
from flexlamps.io.fingerprint import cache_root as fingerprint_root
from flexlamps.models.loading.weight_cache import default_cache_dir


def test_every_cache_reads_flexlamps_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    monkeypatch.setenv("FLEXLAMPS_CACHE_DIR", str(tmp_path / "old"))  # the new name wins, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_root() == default_cache_dir() == fingerprint_root() == tmp_path
        assert profile_cache_path().parent == tmp_path


def test_old_variable_still_read_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.delenv("FLEXLAMPS_CACHE", raising=False)
    monkeypatch.setenv("FLEXLAMPS_CACHE_DIR", str(tmp_path))
    with pytest.warns(FutureWarning, match=r"\$FLEXLAMPS_CACHE_DIR is deprecated.*set \$FLEXLAMPS_CACHE"):
        assert default_cache_dir() == tmp_path


def test_default_is_the_user_cache(monkeypatch, tmp_path):
    for name in ("FLEXLAMPS_CACHE", "FLEXLAMPS_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == Path(tmp_path) / ".cache" / "flexlamps"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "flexlamps"


def test_a_profile_is_kept_per_thread_count(monkeypatch, tmp_path):
    """Rates taken at 2 threads priced a 1-thread run twice too fast: each thread count has its file."""
    import torch

    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = profile_cache_path()
        torch.set_num_threads(2)
        two = profile_cache_path()
    finally:
        torch.set_num_threads(before)
    assert one != two and one.parent == two.parent == tmp_path
    assert profile_cache_path(expert_dims=(64, 32)) != two

