"""`flexlamps agents --self-debug / --gsm8k / --tools` on a tiny random model: a record for every
task under every policy, programs identical under every policy, recorded results equal to
running the programs again, resumable output."""

import json
import os
import shutil
import stat
import textwrap

import pytest
from click.testing import CliRunner

from flexlamps.cli import main

TASKS = [
    {"task_id": "held/0", "prompt": "def add(a, b):\n", "entry_point": "add",
     "test": "def check(c):\n    assert c(1, 2) == 3\n"},
    {"task_id": "held/1", "prompt": "def neg(x):\n", "entry_point": "neg",
     "test": "def check(c):\n    assert c(2) == -2\n"},
    {"task_id": "held/2", "prompt": "def one():\n", "entry_point": "one",
     "test": "def check(c):\n    assert c() == 1\n"},
]
ENTRY = {t["task_id"]: t["entry_point"] for t in TASKS}


@pytest.fixture(scope="module")
def long_tiny(tiny_llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("long_tiny_cli") / "model"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 1024
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _common(model, out):
    # the programs end in a fraction of a second; a 1 s limit could time one out on a loaded box, and
    # the feedback of a timeout would change the next round's program (and the policies' agreement)
    return ["agents", "--model", str(model), "--dtype", "float32", "--max-new-tokens", "8", "--max-context", "700",
            "--block-size", "8", "--max-num-seqs", "3", "--tool-timeout", "60", "--out", str(out)]


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_self_debug_on_held_out_tasks(long_tiny, tmp_path):
    tasks = tmp_path / "held.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    out = tmp_path / "out"
    args = [*_common(long_tiny, out), "--self-debug", str(tasks), "--rounds", "2", "--recheck",
            "--schedulers", "lamps,infercept,fcfs"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "programs identical under every policy: yes" in res.output
    assert "recheck: 18 programs run again, 0 differ from their record" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks"] == {"programs_identical": True, "recheck_mismatches": []}
    for policy in ("lamps", "infercept", "fcfs"):
        records = _jsonl(out / f"{policy}.jsonl")
        assert [r["task_id"] for r in records] == ["held/0", "held/1", "held/2"]
        for r in records:
            assert len(r["rounds"]) == 2 and r["tool_calls"] == 2 and r["e2e_s"] > 0
            for rd in r["rounds"]:
                assert rd["tool_seconds"] > 0 and rd["program"].endswith(f"check({ENTRY[r['task_id']]})\n")
                assert set(rd) >= {"completion", "program", "passed", "tool_seconds", "feedback"}
        assert all(rd["feedback"] for r in records for rd in r["rounds"])  # a random model fails its tests
        s = summary["policies"][policy]
        assert s["tasks"] == 3 and s["tool_calls"] == 6 and len(s["pass_at_round"]) == 2
        assert sum(s["strategies"].values()) == 6 and s["pass_at_round"] == [0.0, 0.0]
    # run again: every policy is already there
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0 and res.output.count("already in") == 3


def test_gsm8k_and_tools_workloads(long_tiny, tmp_path):
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "2+3=5\n#### 5"}) + "\n")
    umask = os.umask(0o002)
    try:
        res = CliRunner().invoke(main, [*_common(long_tiny, tmp_path / "g"), "--gsm8k", str(gsm), "--schedulers",
                                        "lamps"])
    finally:
        os.umask(umask)
    assert res.exit_code == 0, res.output
    # the outputs follow the umask (as a plain open's would), and the --out lock is gone
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "g").iterdir() if p.suffix != ".png"} == {
        "lamps.jsonl": 0o664, "summary.json": 0o664}
    assert not list(tmp_path.glob("g.lock*"))
    rec = _jsonl(tmp_path / "g" / "lamps.jsonl")[0]
    assert rec["gold"] == "5" and "accuracy" in json.loads((tmp_path / "g" / "summary.json").read_text())[
        "policies"]["lamps"]
    module = tmp_path / "tools.py"
    module.write_text(textwrap.dedent('''
        def add(a: int, b: int):
            """Add two integers."""
            return a + b
    '''))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("add 2 and 3\nadd 4 and 5\n")
    res = CliRunner().invoke(main, [*_common(long_tiny, tmp_path / "t"), "--tools", str(module), "--prompts",
                                    str(prompts), "--schedulers", "lamps,fcfs"])
    assert res.exit_code == 0, res.output
    assert [r["task_id"] for r in _jsonl(tmp_path / "t" / "fcfs.jsonl")] == ["1", "2"]


@pytest.mark.parametrize("extra, message", [
    ([], "give one workload"),
    (["--trace", "{tasks}", "--self-debug", "{tasks}"], "got --trace and --self-debug"),
    (["--gsm8k", "{tasks}", "--prompts", "{tasks}"], "--prompts goes with --tools"),
    (["--self-debug", "{bad}"], "missing or empty field(s) entry_point"),
    (["--gsm8k", "{list_answer}"], "list_answer.jsonl line 1: a GSM8K task is"),
    (["--gsm8k", "{number_question}"], "number_question.jsonl line 1: a GSM8K task is"),
    (["--tools", "{lambda_tools}", "--prompts", "{tasks}"], "lambda_tools.py: the description of its tools is "
                                                            "malformed (tool 0's name '<lambda>' is not an identifier)"),
])
def test_bad_workload_options_fail_before_the_model_loads(tmp_path, no_model_load, extra, message):
    files = {"tasks": "t.jsonl", "bad": "bad.jsonl", "list_answer": "list_answer.jsonl",
             "number_question": "number_question.jsonl", "lambda_tools": "lambda_tools.py"}
    paths = {key: tmp_path / name for key, name in files.items()}
    paths["tasks"].write_text(json.dumps(TASKS[0]) + "\n")
    paths["bad"].write_text(json.dumps({k: v for k, v in TASKS[0].items() if k != "entry_point"}) + "\n")
    paths["list_answer"].write_text(json.dumps({"question": "2 + 3?", "answer": ["2+3=5", "#### 5"]}) + "\n")
    paths["number_question"].write_text(json.dumps({"question": 5, "answer": "#### 5"}) + "\n")
    paths["lambda_tools"].write_text("TOOLS = [lambda x: x]\n")
    extra = [e.format(**paths) for e in extra]
    res = CliRunner().invoke(main, ["agents", "--out", str(tmp_path / "o"), *extra])
    assert res.exit_code != 0 and message in res.output, res.output
    assert isinstance(res.exception, SystemExit) and res.output.count("Error") == 1, res.output  # no traceback


def test_a_program_that_exits_before_its_tests_is_recorded_failed(long_tiny, tmp_path):
    """The task's own code calls exit(0) before the (failing) tests: a failure, and the record says why.
    Whatever the random model writes lands in a raw string the test code closes."""
    task = {"task_id": "exits/0", "entry_point": "add",
            "prompt": 'import sys\nsys.exit(0)\n\n\ndef add(a, b):\n    return a - b\n\n\nNOTES = r"""\n',
            "test": '"""\n\n\ndef check(c):\n    assert c(1, 2) == 3\n'}
    tasks = tmp_path / "exits.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, [*_common(long_tiny, out), "--self-debug", str(tasks), "--rounds", "1",
                                    "--schedulers", "fcfs"])
    assert res.exit_code == 0, res.output
    (rd,) = _jsonl(out / "fcfs.jsonl")[0]["rounds"]
    assert rd["passed"] is False and rd["tool_status"] == "exited", rd
    assert "SystemExit: 0" in rd["feedback"] and "before it ran to its end" in rd["feedback"]
    assert json.loads((out / "summary.json").read_text())["policies"]["fcfs"]["pass_at_round"] == [0.0]


def test_without_a_sandbox_agents_refuses_to_run_tools_unless_told(tmp_path, monkeypatch, long_tiny):
    from flexlamps.tools import sandbox

    monkeypatch.setattr(sandbox, "boundary_problem", lambda: "bubblewrap (bwrap) is not on PATH; install it")
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(TASKS[0]) + "\n")
    res = CliRunner().invoke(main, [*_common(long_tiny, tmp_path / "o"), "--self-debug", str(tasks)])
    assert res.exit_code != 0 and "bwrap" in res.output and "--unsafe-tools" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(main, [*_common(long_tiny, tmp_path / "u"), "--self-debug", str(tasks), "--rounds", "1",
                                    "--schedulers", "fcfs", "--unsafe-tools"])
    assert res.exit_code == 0 and "warning: --unsafe-tools" in res.output, res.output
    assert (tmp_path / "u" / "fcfs.jsonl").exists()
