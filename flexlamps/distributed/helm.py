"""`flexlamps helm --ray`: each run's requests sharded over engine workers, run folders written
by the driver.

A shard is one batch: the `batch_size` consecutive pending requests the single-process
executor would send together, so every request meets the same batch and the same shared
prefix, and its result is the one a single process computes. Workers run their shard with
the evaluation `Executor` itself; the driver puts the returned requests in place, appends
them to the run's progress log (resume works as in one process) and writes the folder.
The workers are started on the first run that has requests to do and kept for the next runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from functools import cached_property
from typing import Callable, Optional

from flexlamps.distributed.cluster import ray_cluster, worker_offload_dir
from flexlamps.distributed.pool import ActorPool, Shard, worker_info
from flexlamps.evals.executor import Executor, ProgressLog


class HelmWorker:
    """One engine answering request states (see GenerateWorker for the kept constructor error)."""

    def __init__(self, model: str, dtype: str, llm_args: dict, threads: int, *, rank: int):
        self.rank = rank
        self.error: BaseException | None = None
        try:
            import torch

            from flexlamps.api import LLM  # lazy (torch): only the Ray actor's process loads the engine

            torch.set_num_threads(threads)
            args = dict(llm_args)
            if args.get("offload_dir"):
                args["offload_dir"] = worker_offload_dir(args["offload_dir"], rank)
            self.llm = LLM(model, dtype=dtype, **args)
        except Exception as e:  # noqa: BLE001 -- re-raised by describe() in the driver
            self.error = e

    def describe(self) -> dict:
        if self.error is not None:
            raise self.error
        return worker_info(self.rank, [])

    def run(self, states: list) -> list:
        """Answer one batch of request states; returns them with their results (the executor
        records each request's time and share of the prefill counters in its result)."""
        from flexlamps.api import SamplingParams  # lazy (torch): in the actor, as __init__

        Executor(self.llm, SamplingParams, batch_size=len(states)).run(states, ProgressLog(None))
        return states


class RayEngine:
    """Stands in for the LLM on the driver: the checkpoint's tokenizer and config (to fit
    prompts to the context) without its weights, and `executor` for `execute_run`."""

    def __init__(self, model: str, dtype: str, llm_args: dict, address: Optional[str], num_workers: Optional[int],
                 threads: int = 1, on_workers: Optional[Callable[[list[dict]], None]] = None):
        self.model, self.dtype, self.llm_args, self.threads = model, dtype, llm_args, threads
        self.address, self.num_workers = address, num_workers
        self.on_workers = on_workers
        self._stack = contextlib.ExitStack()
        self._pool: Optional[ActorPool] = None

    @cached_property
    def _reader(self):
        from flexlamps.api import open_checkpoint  # lazy (torch): the driver holds no engine

        return open_checkpoint(self.model)

    @property
    def tokenizer(self):
        return self._reader.tokenizer

    @property
    def config(self):
        return self._reader.config

    def pool(self) -> ActorPool:
        if self._pool is None:
            slots = self._stack.enter_context(ray_cluster(self.address, self.num_workers, self.threads))
            self._pool = ActorPool(HelmWorker, (self.model, self.dtype, self.llm_args, self.threads), slots)
            self._stack.callback(self._pool.close)
            if self.on_workers:
                self.on_workers([w.info for w in self._pool.workers])
        return self._pool

    def executor(self, llm, make_sampling_params, batch_size: int) -> "RayExecutor":
        """`execute_run`'s executor factory; the workers build their own sampling parameters."""
        return RayExecutor(self, batch_size)

    def close(self) -> None:
        self._stack.close()


class RayExecutor:
    """The evaluation `Executor`'s `run`, with the batches answered by the workers."""

    def __init__(self, engine: RayEngine, batch_size: int):
        self.engine = engine
        self.batch_size = max(1, batch_size)

    def run(self, states: list, log, on_progress: Optional[Callable[[int], None]] = None) -> None:
        pending = [i for i, s in enumerate(states) if s.result is None]
        batches = [pending[start:start + self.batch_size] for start in range(0, len(pending), self.batch_size)]
        if not batches:
            return

        def done(shard: Shard, answered: list) -> None:
            idx = batches[shard.index]
            for i, state in zip(idx, answered):
                _update(states[i], state)
            log.append([(i, states[i]) for i in idx])
            if on_progress:
                on_progress(len(idx))

        shards = [Shard(n, [states[i] for i in idx]) for n, idx in enumerate(batches)]
        self.engine.pool().run(shards, "run", done)


def _update(state, answered) -> None:
    """Copy a worker's answer into the driver's own request state, in place: the caller holds
    references to it (and the executor may have changed more than `result`, e.g. the context)."""
    for f in dataclasses.fields(state):
        setattr(state, f.name, getattr(answered, f.name))
