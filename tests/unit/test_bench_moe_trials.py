"""scripts/bench_moe.py --repeats: each side keeps its best trial (the fastest decode, or for a
prompt-heavy row the shortest prefill), a failed trial never wins over one that ran, and the sides
take turns."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

_scripts = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(_scripts))
_spec = importlib.util.spec_from_file_location("bench_moe", _scripts / "bench_moe.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _trial(prefill_s: float, full_s: float, gen_len: int = 4) -> dict:
    run = {"read_bytes": 0, "rchar": 0}
    return {"runs": {1: {"s": prefill_s, **run}, gen_len: {"s": full_s, **run}}}


def test_the_fastest_decode_wins_and_a_failure_never_does():
    slow, fast = _trial(1.0, 4.0), _trial(2.0, 3.5)  # decode 3 steps in 3.0 s vs 1.5 s
    assert bench.best_trial([slow, "failed: killed", fast], 1, 4, prompt_heavy=False) is fast
    assert bench.best_trial(["failed: a", "failed: b"], 1, 4, prompt_heavy=False) == "failed: b"


def test_a_prompt_heavy_row_keeps_the_shortest_prefill():
    slow, fast = _trial(1.0, 4.0), _trial(2.0, 3.5)
    assert bench.best_trial([fast, slow], 1, 4, prompt_heavy=True) is slow


def test_sides_take_turns_for_each_trial(monkeypatch):
    order = []

    def run_side(side, *_):
        order.append(side)
        return _trial(1.0, 2.0 + len(order))

    monkeypatch.setattr(bench, "_run_side", run_side)
    args = argparse.Namespace(sides="flexlamps,llama.cpp", repeats=3)
    results = bench._run_row("decode-heavy", args, None, 1, 32, 4)
    assert order == ["flexlamps", "llama.cpp"] * 3
    assert results["flexlamps"]["runs"][4]["s"] == 3.0  # its first trial: the shortest decode


def test_repeats_below_one_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_moe.py", "--repeats", "0"])
    with pytest.raises(SystemExit):
        bench._args()
    assert "--repeats 0" in capsys.readouterr().err
