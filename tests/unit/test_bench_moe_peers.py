"""scripts/bench_moe_peers.py: a capped side's bytes read are its own count at exit (not a poll that
misses the end), and llama.cpp's decode bytes are those read in its decode window, not the
difference of two runs' totals (which each run's model load swamps)."""

import importlib.util
import os
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "bench_moe_peers", Path(__file__).resolve().parents[2] / "scripts" / "bench_moe_peers.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)


class NoCap:
    def join(self):
        pass


def test_bytes_read_in_the_last_seconds_interpolate_between_polls():
    polls = [(0.5, 100), (1.0, 200), (2.0, 1200), (2.5, 1300)]  # the last one at exit
    assert peers.read_in_last(polls, 1.0) == 1300 - 700  # at t=1.5, halfway from 200 to 1200
    assert peers.read_in_last(polls, 0.5) == 100
    assert peers.read_in_last(polls, 5.0) == 1300  # longer than the run: everything


def test_a_child_that_reads_just_before_it_exits_is_counted_whole(tmp_path):
    data = tmp_path / "blob"
    with open(data, "wb") as fh:
        fh.write(b"x" * (4 << 20))
        fh.flush()
        os.fsync(fh.fileno())  # clean pages: the drop takes them
    peers.drop_page_cache(data)
    script = f"import os; fd = os.open({str(data)!r}, os.O_RDONLY); os.read(fd, 4 << 20); print('done')"
    out, read, _ = peers.run_capped(NoCap(), [sys.executable, "-c", script], timeout_s=60)
    assert out.strip() == "done"
    assert read["read_bytes"] >= 4 << 20
    assert read["polls"][-1][1] == read["read_bytes"]
