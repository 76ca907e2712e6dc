"""The live workloads' text handling: reading task files, building and checking programs,
tool-call parsing and scoring (no model)."""

import gzip
import json

import pytest

from flexlamps.agents.gsm8k import CalculatorTask, MathProblem, last_number, load_gsm8k, same_number
from flexlamps.agents.selfdebug import (CodeProblem, SelfDebugTask, build_program, extract_code, load_problems,
                                        pass_at_round, recheck_records)
from flexlamps.agents.toolcalls import parse_call
from flexlamps.tools.sandbox import ToolResult, run_program
from tests.conftest import SHARED_DATA

HUMANEVAL = SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz"
ADD = CodeProblem("t/0", "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "add",
                  "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n")


def _write(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def test_task_files_are_read_and_checked(tmp_path):
    row = {"task_id": "t/0", "prompt": ADD.prompt, "entry_point": "add", "test": ADD.test, "extra": 1}
    _write(tmp_path / "a.jsonl", [row, {**row, "task_id": "t/1"}])
    _write(tmp_path / "a.jsonl.gz", [row], gz=True)
    assert [p.task_id for p in load_problems(tmp_path / "a.jsonl")] == ["t/0", "t/1"]
    assert load_problems(tmp_path / "a.jsonl", limit=1) == [ADD]
    assert load_problems(str(tmp_path / "a.jsonl.gz")) == [ADD]
    _write(tmp_path / "b.jsonl", [{k: v for k, v in row.items() if k != "test"}])
    with pytest.raises(ValueError, match="line 1: missing or empty field.*test"):
        load_problems(tmp_path / "b.jsonl")
    _write(tmp_path / "c.jsonl", [row, row])
    with pytest.raises(ValueError, match="task ids repeat"):
        load_problems(tmp_path / "c.jsonl")
    (tmp_path / "d.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="not a readable HumanEval-format"):
        load_problems(tmp_path / "d.jsonl")


def test_programs_from_whole_functions_or_bodies():
    whole = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(whole) == "def add(a, b):\n    return a + b\n"
    assert extract_code("```python\ndef add(a, b):\n    return a") == "def add(a, b):\n    return a"  # unclosed
    assert run_program(build_program(ADD, whole)).ok
    assert run_program(build_program(ADD, "    return a + b\n")).ok  # a body for the prompt's signature
    wrong = run_program(build_program(ADD, "```python\ndef add(a, b):\n    return a - b\n```"))
    assert wrong.status == "error" and "assert candidate(1, 2) == 3" in wrong.output


def test_self_debug_rounds_and_feedback():
    task = SelfDebugTask(ADD, max_rounds=2)
    call = task.end_segment("```python\ndef add(a, b):\n    return a - b\n```")
    result = call.run()
    role, feedback = task.tool_turn(call, result, True)
    assert role == "user" and "assert candidate(1, 2) == 3" in feedback and "Fix the function" in feedback
    call = task.end_segment("```python\ndef add(a, b):\n    return a + b\n```")
    assert task.tool_turn(call, call.run(), True) is None and task.passed
    rec = task.record()
    assert [r["passed"] for r in rec["rounds"]] == [False, True] and rec["rounds"][1]["feedback"] is None
    assert all(r["tool_seconds"] > 0 and "check(add)" in r["program"] for r in rec["rounds"])
    assert pass_at_round([task], 2) == [0.0, 1.0]
    assert recheck_records([rec], "lamps") == []
    rec["rounds"][0]["passed"] = True
    assert recheck_records([rec], "lamps") == ["lamps t/0 round 1"]


def test_out_of_rounds_or_room_ends_the_task():
    task = SelfDebugTask(ADD, max_rounds=1)
    call = task.end_segment("def add(a, b):\n    return 0\n")
    assert task.tool_turn(call, call.run(), True) is None and not task.passed
    task = SelfDebugTask(ADD, max_rounds=3)
    call = task.end_segment("def add(a, b):\n    return 0\n")
    assert task.tool_turn(call, call.run(), can_continue=False) is None


@pytest.mark.skipif(not HUMANEVAL.exists(), reason="needs ../shared/data/humaneval")
def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    rows = [json.loads(line) for line in gzip.open(HUMANEVAL, "rt")][:8]
    for row, problem in zip(rows, load_problems(HUMANEVAL, limit=8)):
        assert run_program(build_program(problem, row["canonical_solution"])).ok, problem.task_id
        assert run_program(build_program(problem, "```python\n" + problem.prompt + row["canonical_solution"]
                                         + "```")).ok, problem.task_id
        assert not run_program(build_program(problem, "    return None\n")).ok, problem.task_id


def test_gsm8k_tasks_and_scoring(tmp_path):
    _write(tmp_path / "g.jsonl", [{"question": "2 apples and 3 more?", "answer": "2+3=5\n#### 5"},
                                  {"question": "Big?", "answer": "#### 1,200"}])
    problems = load_gsm8k(tmp_path / "g.jsonl")
    assert [p.answer for p in problems] == ["5", "1200"] and problems[0].task_id == "gsm8k/0"
    _write(tmp_path / "bad.jsonl", [{"question": "q", "answer": "no marker"}])
    with pytest.raises(ValueError, match="line 1: a GSM8K task"):
        load_gsm8k(tmp_path / "bad.jsonl")
    assert last_number("so 1,234.5 in all.") == "1234.5" and last_number("none") is None
    assert same_number("5.0", "5") and not same_number(None, "5") and not same_number("x", "5")
    task = CalculatorTask(MathProblem("g/0", "2 apples and 3 more?", "5"), max_calls=2)
    call = task.end_segment("```python\nprint(2 + 3)\n```")
    role, content = task.tool_turn(call, call.run(), True)
    assert call.name == "python" and "5" in content
    assert task.end_segment("The answer is 5.") is None and task.correct
    task = CalculatorTask(MathProblem("g/1", "q", "7"), max_calls=1)
    call = task.end_segment("```python\nprint(3 + 4)\n```")
    task.tool_turn(call, call.run(), True)
    assert task.end_segment("```python\nprint(1)\n```") is None  # out of calls: the printed 7 stands
    assert task.prediction == "7" and task.correct


def test_tool_calls_are_parsed():
    names = {"add"}
    assert parse_call('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', names) == ("add", {"a": 1})
    assert parse_call('<tool_call>{"name": "add", "arguments": "{\\"a\\": 2}"}</tool_call>', names) == ("add", {"a": 2})
    assert parse_call("no call here", names) is None
    assert "not valid JSON" in parse_call("<tool_call>{oops</tool_call>", names)
    assert "no tool named 'sub'" in parse_call('<tool_call>{"name": "sub"}</tool_call>', names)
    assert "JSON object" in parse_call('<tool_call>["add"]</tool_call>', names)
    assert ToolResult("ok", "", 0.0, value="3").text() == "3"
