"""Program-aided GSM8K: the model answers a grade-school math problem by writing a short Python
program (the calculator tool runs it in the sandbox), reads what it printed, and states the
answer; it may run a corrected program up to `max_calls` times. Scored by the final number.

A task file is GSM8K's JSON lines `{question, answer}` whose `answer` ends in `#### <number>`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

from flexlamps.agents.selfdebug import closes_code_block, extract_code
from flexlamps.agents.task import ToolCall
from flexlamps.tools.sandbox import Limits, ToolResult, run_program

INSTRUCTION = ("Solve the problem with Python. Write a short program in one ```python code block that prints the "
               "answer as a number; you will be shown what it prints. Then reply with 'The answer is <number>.'\n\n"
               "Problem: {question}")
OUTPUT = "The program printed:\n{output}\n\nReply with 'The answer is <number>.', or fix the program."
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class MathProblem:
    task_id: str
    question: str
    answer: str  # the gold number, as written after ####


def load_gsm8k(path: str, limit: int | None = None) -> list[MathProblem]:
    problems = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                problems.append(_problem(json.loads(line), path, n))
                if limit is not None and len(problems) == limit:
                    break
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable GSM8K .jsonl file ({e})") from None
    if not problems:
        raise ValueError(f"{path}: no tasks in the file")
    return problems


def _problem(row, path: str, n: int) -> MathProblem:
    """Line `n`'s task; an error naming the line where it is not {"question": str, "answer": str}
    with a number after the answer's '####'."""
    question, answer = (row.get("question"), row.get("answer")) if isinstance(row, dict) else (None, None)
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "") if isinstance(answer, str) and "####" in answer else ""
    if not isinstance(question, str) or not question.strip() or last_number(gold) != gold:
        raise ValueError(f"{path} line {n}: a GSM8K task is {{\"question\": text, \"answer\": text ending in "
                         "'#### <number>'}")
    return MathProblem(f"gsm8k/{n - 1}", question, gold)


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text or "")
    return found[-1].replace(",", "").rstrip(".") if found else None


def same_number(a: str | None, b: str) -> bool:
    try:
        return a is not None and abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return False


@dataclass
class CalculatorTask:
    problem: MathProblem
    max_calls: int = 2
    limits: Limits = Limits(wall_s=5, cpu_s=5)
    kind: str = "gsm8k"
    turns: list[dict] = field(default_factory=list)
    prediction: str | None = None

    @property
    def task_id(self) -> str:
        return self.problem.task_id

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": INSTRUCTION.format(question=self.problem.question)}]

    def segment_done(self, text: str) -> bool:
        return closes_code_block(text)

    def end_segment(self, text: str) -> ToolCall | None:
        calls = sum("program" in t for t in self.turns)
        if "```" not in text or calls >= self.max_calls:
            stated = re.search(r"answer is\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", text, re.I)
            printed = next((t["output"] for t in reversed(self.turns) if t.get("status") == "ok"), None)
            self.prediction = (stated.group(1).replace(",", "") if stated else last_number(printed)
                               if printed is not None else last_number(text))
            self.turns.append({"completion": text})
            return None
        program = extract_code(text)
        self.turns.append({"completion": text, "program": program})
        return ToolCall("python", functools.partial(run_program, program, self.limits))

    def tool_turn(self, call: ToolCall, result: ToolResult, can_continue: bool) -> tuple[str, str] | None:
        text = result.text(self.limits.max_chars)
        self.turns[-1].update(output=text, status=result.status, tool_seconds=result.seconds)
        if not can_continue:
            self.prediction = last_number(text) if result.ok else None
            return None
        return "user", OUTPUT.format(output=text)

    @property
    def correct(self) -> bool:
        return same_number(self.prediction, self.problem.answer)

    def record(self) -> dict:
        return {"task_id": self.task_id, "gold": self.problem.answer, "prediction": self.prediction,
                "correct": self.correct, "turns": self.turns}


def accuracy(tasks: list[CalculatorTask]) -> dict:
    return {"accuracy": sum(t.correct for t in tasks) / max(1, len(tasks))}
