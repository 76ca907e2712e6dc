"""A pool of engine actors that runs shards of work and survives lost workers.

Each worker is a Ray actor holding one engine. The driver keeps up to `depth` shards queued
on every worker (so a worker never waits on the driver between shards) and hands each
finished shard's result to `on_done` at once, in the driver process: only the driver writes
output files. When a worker dies (process killed, node lost), its unfinished shards go back to
the queue and a fresh worker takes its slot; a shard is tried at most `max_attempts` times.
A shard is reported once: it is requeued only when its own call failed.

Actor classes are plain Python classes wrapped with `ray.remote` here, so the modules that
define them import without Ray. A worker class must offer `describe()` (raising the error its
constructor hit, if any) and the method named in `run`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from flexlamps.distributed.cluster import DistributedError, WorkerSlots, import_ray

DEFAULT_MAX_ATTEMPTS = 3
log = logging.getLogger(__name__)


def worker_info(rank: int, lines: list[str]) -> dict:
    """What a worker's describe() returns: where it runs and what it wants printed."""
    return {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "lines": list(lines)}


class WorkerLostError(DistributedError):
    """A shard lost its worker `max_attempts` times."""


@dataclass
class Shard:
    index: int  # position in the caller's list
    payload: Any  # what the worker method receives
    attempt: int = 0  # times it was lost with its worker
    worker: int | None = None  # slot of the worker that last ran it (for logs and fault tests)


@dataclass
class _Worker:
    slot: int
    actor: Any
    info: dict  # what describe() returned: pid, node, lines to print


class ActorPool:
    """`worker_cls(*args, rank=slot)` actors, one per slot of `slots`, started together."""

    def __init__(self, worker_cls: type, args: tuple, slots: WorkerSlots, *, depth: int = 2,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS):
        self.ray = import_ray()
        self._remote = self.ray.remote(max_restarts=0)(worker_cls).options(**slots.actor_options)
        self._args = args
        self.depth = depth
        self.max_attempts = max_attempts
        self.replaced = 0  # workers lost and replaced so far
        actors = [self._spawn(slot) for slot in range(slots.num_workers)]
        infos = self._get_unwrapped([a.describe.remote() for a in actors])
        self.workers = [_Worker(slot, a, info) for slot, (a, info) in enumerate(zip(actors, infos))]

    def _spawn(self, slot: int):
        return self._remote.remote(*self._args, rank=slot)

    def _get_unwrapped(self, refs):
        """ray.get, raising a worker's own exception as its own type (e.g. a bad budget)."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None

    def _replace(self, worker: _Worker) -> None:
        self.ray.kill(worker.actor, no_restart=True)
        worker.actor = self._spawn(worker.slot)
        worker.info = self._get_unwrapped(worker.actor.describe.remote())
        self.replaced += 1

    def run(self, shards: list[Shard], method: str, on_done: Callable[[Shard, Any], None]) -> None:
        """Run every shard on some worker; `on_done(shard, result)` as each one finishes."""
        queue = deque(shards)
        in_flight: dict[Any, tuple[_Worker, Any, Shard]] = {}  # ref -> (worker, its actor then, shard)
        while queue or in_flight:
            self._submit(queue, in_flight, method)
            [ref], _ = self.ray.wait(list(in_flight), num_returns=1)
            worker, actor, shard = in_flight.pop(ref)
            shard.worker = worker.slot
            try:
                result = self._get_unwrapped(ref)
            except self.ray.exceptions.RayActorError as e:
                self._lost(worker, actor, shard, e, queue)
                continue
            on_done(shard, result)

    def _submit(self, queue: deque, in_flight: dict, method: str) -> None:
        for worker in self.workers:
            busy = sum(1 for w, _, _ in in_flight.values() if w is worker)
            while queue and busy < self.depth:
                shard = queue.popleft()
                in_flight[getattr(worker.actor, method).remote(shard.payload)] = (worker, worker.actor, shard)
                busy += 1

    def _lost(self, worker: _Worker, actor, shard: Shard, error: Exception, queue: deque) -> None:
        shard.attempt += 1
        if shard.attempt >= self.max_attempts:
            raise WorkerLostError(f"shard {shard.index} lost its worker {shard.attempt} times; last: {error}")
        queue.appendleft(shard)
        if worker.actor is actor:  # first failure seen from this actor: give the slot a new one
            log.warning("worker %d (pid %s on %s) was lost; its unfinished shards go to a fresh worker",
                        worker.slot, worker.info.get("pid"), worker.info.get("host"))
            self._replace(worker)

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker.actor, no_restart=True)
        self.workers = []
