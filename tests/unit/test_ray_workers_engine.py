"""A `generate --ray` worker builds the engine the run asks for: in memory unless the run is
offloaded (a worker's own offload folder once made every worker offloaded, and its file differ
from the single process's), offloaded in a folder of its own when it is. No Ray needed: the
worker class is plain Python."""

from unittest import mock

import placement
from flexlamps.distributed.generate import GenerateWorker
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.generate_job import GenerateSettings
from flexlamps.io.records import PromptRecord
from flexlamps.settings import RunSettings


def _worker(model, **run) -> GenerateWorker:
    settings = GenerateSettings(run=RunSettings.parse(str(model), dtype="bfloat16", max_batch_size=2, **run))
    worker = GenerateWorker(settings, 1, [[5, 6, 7]], [PromptRecord("p0", "a prompt")], rank=1)
    if worker.error is not None:
        raise worker.error
    return worker


def test_an_in_memory_run_has_in_memory_workers(tiny_llama):
    worker = _worker(tiny_llama)
    assert isinstance(worker.llm.executor, InMemoryExecutor)
    assert not worker.settings.run.offloaded
    worker.llm.close()


def test_an_offloaded_run_has_offloaded_workers_each_in_its_own_folder(tiny_llama, tmp_path):
    # a preset machine: planning does not measure this one
    with mock.patch("flexlamps.hardware.cache.machine_profile", lambda *a, **k: placement.hardware_preset("rtx3090")):
        worker = _worker(tiny_llama, offload_dir=str(tmp_path), gpu_mem="64MiB", cpu_mem="256MiB")
    assert isinstance(worker.llm.executor, OffloadExecutor)
    assert worker.settings.run.offload_dir == str(tmp_path / "ray-worker-1")
    worker.llm.close()
