"""The live workloads by name: how to read their tasks (before any model loads, so a bad file
fails first), make fresh task objects for each policy's run, and score what they did."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from flexlamps.agents.gsm8k import CalculatorTask, accuracy, load_gsm8k
from flexlamps.agents.selfdebug import SelfDebugTask, load_problems, pass_at_round
from flexlamps.agents.toolcalls import ToolUseTask, load_tools, tool_score
from flexlamps.io.prompts import read_prompts
from flexlamps.tools.sandbox import Limits

WORKLOADS = ("self-debug", "gsm8k", "tools")
TURN_ROOM = 320  # tokens a tool turn may add (the feedback's cap in tokens, with its chat frame)


@dataclass
class Workload:
    name: str
    make_tasks: Callable[[], list]  # fresh tasks (they record what they do)
    score: Callable[[list], dict]
    longest_prompt_chars: int

    def context_for(self, max_new_tokens: int, rounds: int, chars_per_token: float = 3.0) -> int:
        """A context cap that fits the longest prompt and every round (an estimate in tokens)."""
        return int(self.longest_prompt_chars / chars_per_token) + 256 + rounds * (max_new_tokens + TURN_ROOM)


def load_workload(name: str, path: str, *, rounds: int, limit: int | None, tool_timeout: float,
                  prompts: str | None = None, unsafe_tools: bool = False) -> Workload:
    """`path`: the task file (self-debug, gsm8k) or the tools' Python file (tools, with `prompts`);
    `unsafe_tools`: run the tools without the OS sandbox (see flexlamps.tools.sandbox)."""
    limits = Limits(wall_s=tool_timeout, cpu_s=max(1, math.ceil(tool_timeout)), unsafe=unsafe_tools)
    if name == "self-debug":
        problems = load_problems(path, limit)
        return Workload(name, lambda: [SelfDebugTask(p, rounds, limits) for p in problems],
                        lambda tasks: {"pass_at_round": pass_at_round(tasks, rounds)},
                        max(len(p.prompt) for p in problems))
    if name == "gsm8k":
        problems = load_gsm8k(path, limit)
        return Workload(name, lambda: [CalculatorTask(p, rounds, limits) for p in problems], accuracy,
                        max(len(p.question) for p in problems))
    if name == "tools":
        if prompts is None:
            raise ValueError("--tools needs --prompts FILE: the requests that may call the tools")
        records = read_prompts(prompts)[:limit]
        if any(r.prompt is None or r.error is not None for r in records):
            raise ValueError(f"--prompts {prompts}: the tools workload takes {{\"id\", \"prompt\"}} lines")
        tools = load_tools(path, limits)
        schema_chars = sum(len(str(t)) for t in tools) + 600
        return Workload(name, lambda: [ToolUseTask(r.id, r.prompt, path, tools, rounds, limits) for r in records],
                        tool_score, schema_chars + max(len(r.prompt) for r in records))
    raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
