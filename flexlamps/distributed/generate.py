"""`flexlamps generate --ray`: prompts sharded over engine workers, records merged on the driver.

A shard is `batch_size` consecutive prompts still to do. Each worker builds its own engine (in
memory, or offloaded as the run asks: planning its placement for its own device and budgets,
with its own offload folder) and runs
its shards through the same `generate_rows` as the single-process command. The driver appends
each finished shard's records to the same resumable `<out>.partial` and, at the end, writes
`<out>` in input order: the file a single process writes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from flexlamps.distributed.cluster import WorkerSlots, worker_offload_dir
from flexlamps.distributed.pool import ActorPool, Shard, worker_info
from flexlamps.generate_job import GenerateSettings, generate_rows, prepare_offload


class GenerateWorker:
    """One engine. `plan_ids`: token ids of the prompts it plans its placement for (a sample
    of its share). The constructor keeps its error for `describe`, so the driver sees the
    engine's own exception (a budget too small, a policy file missing) and not a dead actor."""

    def __init__(self, settings: GenerateSettings, threads: int, plan_ids: list[list[int]], plan_records: list, *,
                 rank: int):
        # an offloaded run's workers each take a folder of their own; an in-memory run stays in
        # memory (a folder would make it offloaded: `RunSettings.offloaded`)
        self.settings = settings.with_offload_dir(worker_offload_dir(settings.run.offload_dir, rank)) \
            if settings.run.offloaded else settings
        self.rank = rank
        self.lines: list[str] = []
        self.error: BaseException | None = None
        try:
            import torch

            torch.set_num_threads(threads)
            self.llm = self.settings.load_llm()
            if self.settings.run.offloaded:
                self.lines = prepare_offload(self.llm, plan_ids, self.settings, records=plan_records)
        except Exception as e:  # noqa: BLE001 -- re-raised by describe() in the driver
            self.error = e

    def describe(self) -> dict:
        if self.error is not None:
            raise self.error
        return worker_info(self.rank, self.lines)

    def run(self, shard: list[tuple]) -> tuple[list[dict], int]:
        """`shard`: (PromptRecord, token ids) pairs. Returns their records (finish order) and
        the tokens generated."""
        records, ids = [r for r, _ in shard], [i for _, i in shard]
        rows: list[dict] = []
        tokens = [0]
        generate_rows(self.llm, self.settings, records, ids, rows.append,
                      on_tokens=lambda n: tokens.__setitem__(0, tokens[0] + n))
        return rows, tokens[0]


def shard_prompts(records: list, prompt_ids: list[list[int]], shard_size: int) -> list[Shard]:
    pairs = list(zip(records, prompt_ids))
    return [Shard(n, pairs[start:start + shard_size]) for n, start in enumerate(range(0, len(pairs), shard_size))]


def generate_on_ray(settings: GenerateSettings, threads: int, slots: WorkerSlots, records: list,
                    prompt_ids: list[list[int]], on_rows: Callable[[list[dict], int], None],
                    on_workers: Callable[[list[dict]], None] | None = None,
                    on_shard: Callable[[ActorPool, Shard], None] | None = None) -> ActorPool:
    """Generate `records` (with their ids) on `slots` workers; `on_rows(rows, tokens)` in the
    driver as each shard finishes. `on_workers` sees each worker's description once started;
    `on_shard(pool, shard)` runs after each shard is recorded (tests use it to kill a worker)."""
    shards = shard_prompts(records, prompt_ids, settings.run.max_batch_size)
    num_workers = min(slots.num_workers, len(shards))
    per_worker = -(-len(records) // num_workers)
    plan = (prompt_ids[:per_worker], records[:per_worker])
    pool = ActorPool(GenerateWorker, (settings, threads, *plan), dataclasses.replace(slots, num_workers=num_workers))
    try:
        if on_workers:
            on_workers([w.info for w in pool.workers])

        def done(shard: Shard, result) -> None:
            on_rows(*result)
            if on_shard:
                on_shard(pool, shard)

        pool.run(shards, "run", done)
    finally:
        pool.close()
    return pool

