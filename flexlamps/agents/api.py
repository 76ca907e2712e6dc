"""`LLM.run_agents`: agent tasks with live tools on the augmented engine, from Python."""

from __future__ import annotations

from typing import Sequence

from flexlamps.agents.run import LiveRun, LiveSettings, run_tasks
from flexlamps.agents.toolcalls import ToolUseTask, load_tools
from flexlamps.engine.augmented.run import measure_cost
from flexlamps.engine.executors.contract import Executor
from flexlamps.run_plan import RunPlan
from flexlamps.tools.sandbox import Limits


def run_agents(executor: Executor, tokenizer, plan: RunPlan, tasks: Sequence, tools: str | None = None, *,
               scheduler: str = "lamps", max_new_tokens: int = 128, max_calls: int = 4, workers: int = 2,
               limits: Limits = Limits(), cost=None, check: bool = False) -> LiveRun:
    """Run `tasks` under the scheduling policy `scheduler` (fcfs, infercept, sjf, lamps, mlfq,
    vtc) on `executor`, built for the augmented run `plan` (its pools and context cap):
    `AgentTask` objects (e.g. `selfdebug.SelfDebugTask`), or prompt strings that may call the
    functions of the Python file `tools` (`<tool_call>{json}</tool_call>`, at most `max_calls`
    calls each). Returns the run: per task what it did (`run.tasks[i].record()`), per request
    latency and tool time, swaps and strategies."""
    tasks = _as_tasks(tasks, tools, max_calls, limits)
    max_context = plan.augmented.max_context
    cost = cost or measure_cost(executor, plan.pools, max_context)
    settings = LiveSettings(max_new_tokens=max_new_tokens, max_context=max_context, workers=workers)
    return run_tasks(executor, tokenizer, tasks, scheduler, plan.pools, cost, settings, check=check)


def _as_tasks(tasks: Sequence, tools: str | None, max_calls: int, limits: Limits) -> list:
    if not tasks:
        raise ValueError("run_agents needs at least one task")
    if not any(isinstance(t, str) for t in tasks):
        return list(tasks)
    if not all(isinstance(t, str) for t in tasks):
        raise ValueError("give run_agents either prompt strings or AgentTask objects, not both")
    if tools is None:
        raise ValueError("prompt strings need `tools`: the Python file whose functions they may call")
    schemas = load_tools(tools, limits)
    return [ToolUseTask(str(i), prompt, str(tools), schemas, max_calls, limits) for i, prompt in enumerate(tasks)]
