"""Plans are promises the offload engine keeps: it runs what the planner searches, no more."""

import pytest

import placement
from flexlamps.engine.offload_executor import CAPABILITIES, OffloadExecutor
from placement import Policy, TierSplit

ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)


def test_the_planner_defaults_to_the_engines_capabilities():
    assert CAPABILITIES == placement.EngineCapabilities()


@pytest.mark.parametrize("changes, problem", [
    (dict(cache=TierSplit(gpu=0.5, cpu=0.0, disk=0.5)), "KV cache on disk"),
    (dict(activations=TierSplit(gpu=0.6, cpu=0.4, disk=0.0)), "activations split"),
    (dict(activations=TierSplit(gpu=0.0, cpu=0.0, disk=1.0)), "activations on disk"),
])
def test_the_engine_refuses_what_it_would_not_run_as_planned(changes, problem):
    policy = Policy(gpu_batch_size=1, num_gpu_batches=1, **{
        "weights": ON_GPU, "cache": ON_GPU, "activations": ON_GPU, **changes})
    with pytest.raises(ValueError, match=problem):
        OffloadExecutor(None, policy, gpu_mem=1 << 30, cpu_mem=1 << 30)
