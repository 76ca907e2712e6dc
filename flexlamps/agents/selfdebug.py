"""Self-Debugging (Chen et al.) on HumanEval-format tasks: the model writes the function, the
task's tests run on it (the tool call), and while they fail the model reads the failing
assertion or the traceback's tail and writes the function again, up to `rounds` times.

A task file is JSON lines (`.jsonl`, or gzipped `.jsonl.gz`), one object a task with
`task_id`, `prompt` (the signature and docstring), `entry_point` (the function's name) and
`test` (code defining `check(candidate)`).
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from dataclasses import dataclass, field

from flexlamps.agents.task import ToolCall
from flexlamps.tools.sandbox import Limits, ToolResult, run_program

FIELDS = ("task_id", "prompt", "entry_point", "test")
FEEDBACK_CHARS = 800  # of the test run's output fed back (its tail: where the error is)

INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one ```python code "
               "block.\n\n```python\n{prompt}```")
FEEDBACK = ("Running the tests on your function failed:\n\n{feedback}\n\nFix the function. Reply with the "
            "whole corrected function in one ```python code block.")


@dataclass(frozen=True)
class CodeProblem:
    task_id: str
    prompt: str
    entry_point: str
    test: str


def load_problems(path: str, limit: int | None = None) -> list[CodeProblem]:
    """The tasks of a HumanEval-format file (see the module's docstring), the first `limit`."""
    opener = gzip.open if str(path).endswith(".gz") else open
    problems = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                problems.append(_problem(json.loads(line), path, n))
                if limit is not None and len(problems) == limit:
                    break
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable HumanEval-format .jsonl / .jsonl.gz file ({e})") from None
    if not problems:
        raise ValueError(f"{path}: no tasks in the file")
    ids = [p.task_id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: task ids repeat; each task needs its own task_id")
    return problems


def _problem(row, path, line: int) -> CodeProblem:
    if not isinstance(row, dict):
        raise ValueError(f"{path} line {line}: a task is a JSON object with {', '.join(FIELDS)}")
    missing = [k for k in FIELDS if not isinstance(row.get(k), str) or not row[k].strip()]
    if missing:
        raise ValueError(f"{path} line {line}: missing or empty field(s) {', '.join(missing)} "
                         f"(a task needs {', '.join(FIELDS)})")
    return CodeProblem(*(row[k] for k in FIELDS))


def extract_code(text: str) -> str:
    """The first ```python block of `text` (to its end when unclosed), else the whole text."""
    m = re.search(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", text, re.S)
    return m.group(1) if m else text


def build_program(problem: CodeProblem, completion: str) -> str:
    """What the tests run on: the prompt (its imports and helpers) followed by the model's code,
    a whole function redefining the entry point or, if it defines none, the body the prompt's
    signature lacks; then the tests and the call of `check`."""
    code = extract_code(completion)
    defines = re.search(rf"^[ \t]*def[ \t]+{re.escape(problem.entry_point)}[ \t]*\(", code, re.M)
    source = problem.prompt.rstrip() + "\n\n" + code if defines else problem.prompt + code
    return f"{source.rstrip()}\n\n\n{problem.test.strip()}\n\n\ncheck({problem.entry_point})\n"


def feedback_of(result: ToolResult) -> str:
    """The failing assertion or the traceback's tail (what went wrong, the same in every run)."""
    return result.text(FEEDBACK_CHARS)


def closes_code_block(text: str) -> bool:
    opened = text.find("```")
    return opened >= 0 and text.find("```", opened + 3) >= 0


@dataclass
class SelfDebugTask:
    problem: CodeProblem
    max_rounds: int = 2
    limits: Limits = Limits(wall_s=10, cpu_s=10)
    kind: str = "self-debug"
    rounds: list[dict] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        return self.problem.task_id

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": INSTRUCTION.format(prompt=self.problem.prompt)}]

    def segment_done(self, text: str) -> bool:
        return closes_code_block(text)

    def end_segment(self, text: str) -> ToolCall:
        program = build_program(self.problem, text)
        self.rounds.append({"completion": text, "program": program})
        return ToolCall("run_tests", functools.partial(run_program, program, self.limits))

    def tool_turn(self, call: ToolCall, result: ToolResult, can_continue: bool) -> tuple[str, str] | None:
        passed = result.ok
        feedback = None if passed else feedback_of(result)
        self.rounds[-1].update(passed=passed, tool_status=result.status, tool_seconds=result.seconds,
                               feedback=feedback)
        if passed or len(self.rounds) >= self.max_rounds or not can_continue:
            return None
        return "user", FEEDBACK.format(feedback=feedback)

    @property
    def passed(self) -> bool:
        return bool(self.rounds) and self.rounds[-1].get("passed", False)

    def record(self) -> dict:
        return {"task_id": self.task_id, "passed": self.passed, "rounds": self.rounds}


def pass_at_round(tasks: list[SelfDebugTask], max_rounds: int) -> list[float]:
    """pass@1 after each round: the share of tasks whose tests passed within the first r rounds."""
    n = max(1, len(tasks))
    return [sum(any(rd.get("passed") for rd in t.rounds[:r]) for t in tasks) / n for r in range(1, max_rounds + 1)]


def recheck_records(records: list[dict], policy: str, limits: Limits = Limits(wall_s=10, cpu_s=10)) -> list[str]:
    """Run every recorded program again: the rounds whose pass/fail differs from the record."""
    out = []
    for rec in records:
        for i, rd in enumerate(rec["rounds"]):
            if "passed" in rd and run_program(rd["program"], limits).ok != rd["passed"]:
                out.append(f"{policy} {rec['task_id']} round {i + 1}")
    return out
