"""`LLM.run_agents`: agent tasks with live tools on the augmented engine, from Python."""

from __future__ import annotations

from typing import Sequence

from flexlamps.agents.run import LiveRun, LiveSettings, run_tasks
from flexlamps.settings import AugmentedSettings
from flexlamps.tools.sandbox import Limits


def run_agents(llm, tasks: Sequence, tools: str | None = None, *, scheduler: str = "lamps",
               max_new_tokens: int = 128, max_context: int = 1024, max_calls: int = 4, gpu_kv_mem: int | None = None,
               cpu_swap_mem: int | None = None, block_size: int = 16, max_num_seqs: int = 16,
               max_num_batched_tokens: int = 256, workers: int = 2, limits: Limits = Limits(), cost=None,
               check: bool = False) -> LiveRun:
    """Run `tasks` under the scheduling policy `scheduler` (fcfs, infercept, sjf, lamps, mlfq,
    vtc): `AgentTask` objects (e.g. `selfdebug.SelfDebugTask`), or prompt strings that may call
    the functions of the Python file `tools` (`<tool_call>{json}</tool_call>`, at most `max_calls`
    calls each). Pools: given in bytes, else room for 4 full contexts on each tier (an offloaded
    model: what its tier budgets leave). Returns the run: per task what it did
    (`run.tasks[i].record()`), per request latency and tool time, swaps and strategies."""
    from flexlamps.engine.augmented.run import measure_cost

    tasks = _as_tasks(tasks, tools, max_calls, limits)
    augmented = AugmentedSettings.parse(max_context=max_context, block_size=block_size, max_num_seqs=max_num_seqs,
                                        max_num_batched_tokens=max_num_batched_tokens, gpu_kv_mem=gpu_kv_mem,
                                        cpu_swap_mem=cpu_swap_mem)
    plan = llm.prepare_augmented(augmented)
    cost = cost or measure_cost(llm.executor, plan.pools, max_context)
    settings = LiveSettings(max_new_tokens=max_new_tokens, max_context=max_context, workers=workers)
    return run_tasks(llm, tasks, scheduler, plan.pools, cost, settings, check=check)


def _as_tasks(tasks: Sequence, tools: str | None, max_calls: int, limits: Limits) -> list:
    if not tasks:
        raise ValueError("run_agents needs at least one task")
    if not any(isinstance(t, str) for t in tasks):
        return list(tasks)
    if not all(isinstance(t, str) for t in tasks):
        raise ValueError("give run_agents either prompt strings or AgentTask objects, not both")
    if tools is None:
        raise ValueError("prompt strings need `tools`: the Python file whose functions they may call")
    from flexlamps.agents.toolcalls import ToolUseTask, load_tools

    schemas = load_tools(tools, limits)
    return [ToolUseTask(str(i), prompt, str(tools), schemas, max_calls, limits) for i, prompt in enumerate(tasks)]
