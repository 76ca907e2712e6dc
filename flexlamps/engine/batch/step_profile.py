"""Where a decode step's time goes: torch's ops vs the Python that drives them, measured.

`profile_decode_step` prefills `batch` rows of `prompt_len` tokens in a fresh cache, then times
decode steps (one token per row) of the executor twice: plainly (wall and thread CPU time per
step) and under torch's profiler, which records each op the step dispatches from Python. The
time inside those top-level ops (kernels and the dispatcher's own C++ work; each op's shortest
time over the profiled steps) is what the step spends in torch; the rest of the plain step's
time (the best step; `StepProfile.step_s`) is the Python that runs between them (the forward's
glue, the cache callbacks, building the step) and our native kernels, which are ctypes calls
the profiler does not see (at batch 1 they are most of a bf16 step). Taking the best of each, a burst of load on
shared cores counts in none. The profiler's own bookkeeping adds a little to the ops it
records, so the Python overhead reported is, if anything, an underestimate.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import torch

from flexlamps.engine.executors.step import Step


@dataclass(frozen=True, kw_only=True)
class StepProfile:
    batch: int
    wall_s: float  # one decode step, plain run, best of the steps
    cpu_s: float  # its thread CPU time (excludes time the scheduler gave to other processes), best
    in_ops_s: float  # inside the top-level torch ops of a profiled step, each op's best
    ops_per_step: int  # top-level torch ops one step dispatches
    top_ops: tuple[tuple[str, int, float], ...]  # (op, calls per step, seconds per step), slowest first

    threads: int  # torch's thread count during the run

    @property
    def step_s(self) -> float:
        """The step's time: its wall time, or at one thread its CPU time when less (a step the
        scheduler paused in for other processes on shared cores counts then at its own work)."""
        return min(self.wall_s, self.cpu_s) if self.threads == 1 else self.wall_s

    @property
    def python_s(self) -> float:
        """The step's time outside torch's ops: its Python overhead, and the time in our native
        kernels (ctypes calls, which torch's profiler does not see)."""
        return max(self.step_s - self.in_ops_s, 0.0)


def _decode_step(batch: int, position: int) -> Step:
    rows = torch.arange(batch)
    return Step(torch.full((batch, 1), 5), torch.full((batch, 1), position), rows, torch.zeros(batch, dtype=torch.long))


def _top_level_ops(prof) -> list:
    return [e for e in prof.events() if e.cpu_parent is None and not e.name.startswith("ProfilerStep")]


def profile_decode_step(executor, batch: int = 1, prompt_len: int = 128, steps: int = 16) -> StepProfile:
    """Measure decode steps of `batch` rows after a prompt of `prompt_len` tokens (see the module)."""
    from torch.profiler import ProfilerActivity, profile

    cache = executor.new_cache(batch, prompt_len + 2 * steps + 1)
    executor.forward_steps(cache, [Step(torch.full((batch, prompt_len), 5), torch.arange(prompt_len).expand(batch, -1),
                                        torch.arange(batch), torch.full((batch,), prompt_len - 1))])
    walls, cpus = [], []
    for i in range(steps):
        step = _decode_step(batch, prompt_len + i)
        wall, cpu = time.perf_counter(), time.thread_time()
        executor.forward_steps(cache, [step])
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    runs = []
    for i in range(steps, 2 * steps):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            executor.forward_steps(cache, [_decode_step(batch, prompt_len + i)])
        runs.append(_top_level_ops(prof))
    cache.release()
    names, durations = _fastest_ops(runs)
    calls, seconds = Counter(names), Counter()
    for name, d in zip(names, durations):
        seconds[name] += d
    top = tuple((name, calls[name], s) for name, s in seconds.most_common())
    return StepProfile(batch=batch, wall_s=min(walls), cpu_s=min(cpus), in_ops_s=sum(durations),
                       ops_per_step=len(names), top_ops=top, threads=torch.get_num_threads())


def _fastest_ops(runs: list[list]) -> tuple[list[str], list[float]]:
    """The op names of a step and each op's shortest duration (seconds) over the profiled steps
    that dispatched the same sequence: a step the scheduler paused in counts for the ops it paused
    in only. Steps with another sequence (a span crossing a key block) are left out."""
    names = [e.name for e in runs[0]]
    same = [r for r in runs if [e.name for e in r] == names]
    return names, [min(r[i].cpu_time_total for r in same) / 1e6 for i in range(len(names))]
