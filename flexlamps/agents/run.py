"""One live run of agent tasks under one policy on the augmented engine.

Every task arrives at once (an offline roll-out); the scheduler's predictor learns online what
it cannot read from a trace: segment lengths per workload and call durations per tool
(`LearnedPredictor`). Tools run on a thread pool of `workers`, so calls overlap each other and the
decoding of the other requests. The clock is the wall clock: tools take real time.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from flexlamps.agents.chat import ChatTurns
from flexlamps.agents.live import LiveCalls
from flexlamps.agents.task import AgentTask
from flexlamps.engine.augmented.engine import AugmentedResult, WallClock
from flexlamps.engine.augmented.run import AgentsConfig, run_policy_on_engine
from flexlamps.engine.executors.contract import Executor
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.predictors import LearnedPredictor
from flexlamps.sched.request import RequestSpec
from flexlamps.workloads.tokenized import TokenizedRequest


@dataclass(frozen=True, kw_only=True)
class LiveSettings:
    max_new_tokens: int = 128  # tokens a turn of the model generates at most
    max_context: int = 1024  # tokens a request's conversation reaches at most
    workers: int = 2  # tools running at once
    first_call_s: float = 1.0  # the predictor's guess of a call's duration before it has seen one

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.workers < 1 or self.first_call_s <= 0:
            raise ValueError("max_new_tokens and workers must be >= 1 and first_call_s > 0")
        if self.max_context <= self.max_new_tokens:
            raise ValueError(f"max_context ({self.max_context}) must exceed max_new_tokens ({self.max_new_tokens})")


def _first_prompt(turns: ChatTurns, task: AgentTask) -> list[int]:
    """The task's opening conversation; a task with tools hands them to a template that shows them."""
    tools = getattr(task, "template_tools", None)
    if tools and turns.tokenizer.template_takes_tools:
        return turns.prompt_ids(task.messages(template_shows_tools=True), tools=tools)
    return turns.prompt_ids(task.messages())


@dataclass
class LiveRun:
    policy: str
    result: AugmentedResult  # records, stats, swapped bytes, tier use
    tasks: list[AgentTask]  # in the order given, with what each did
    wall_s: float
    predictor: LearnedPredictor  # what the scheduler learned: call durations per tool, segment lengths


def run_tasks(executor: Executor, tokenizer, tasks: Sequence[AgentTask], policy: str, config: AgentsConfig,
              cost: CostModel, settings: LiveSettings = LiveSettings(), *, check: bool = False,
              on_finish: Callable | None = None) -> LiveRun:
    """Run `tasks` (fresh ones: they record what they do) under `policy` on `executor` (built for
    the run plan whose pools are `config`); `tokenizer` renders the turns."""
    turns = ChatTurns(tokenizer)
    requests, by_id = [], {}
    for task in tasks:
        if task.task_id in by_id:
            raise ValueError(f"task id {task.task_id!r} appears twice; ids must be unique")
        ids = _first_prompt(turns, task)
        if len(ids) + settings.max_new_tokens >= settings.max_context:
            raise ValueError(f"task {task.task_id!r}: its prompt of {len(ids)} tokens leaves no room for "
                             f"{settings.max_new_tokens} new tokens in a context of {settings.max_context}; "
                             "raise the context cap")
        by_id[task.task_id] = task
        requests.append(TokenizedRequest(RequestSpec(task.task_id, len(ids), (), kind=task.kind), tuple(ids), ()))
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(settings.workers, thread_name_prefix="flexlamps-tool") as pool:
        calls = LiveCalls(by_id, turns, max_new_tokens=settings.max_new_tokens,
                          max_context=settings.max_context, pool=pool)
        predictor = LearnedPredictor(default_output=settings.max_new_tokens / 2,
                                     default_api_time=settings.first_call_s)
        result = run_policy_on_engine(executor, requests, policy, config, cost, clock=WallClock(), check=check,
                                      on_finish=on_finish, predictor=predictor, calls=calls)
    return LiveRun(policy, result, list(tasks), time.perf_counter() - start, predictor)
