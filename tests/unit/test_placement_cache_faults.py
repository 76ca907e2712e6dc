"""On a CPU standing in for the GPU a disk-tier KV cache is a mapped file (`caches.disk_rows`): a decode
step faults the rows it attends in on its own compute thread, so the planner prices their reads in the
step's compute, not as disk reads overlapped with it (the 1000-prompt job's plan, cache on disk, ran a
decode sweep in 8.0 s of which 6.8 s the thread's CPU; the cache on the cpu tier, 5.2 s: docs/performance.md)."""

import dataclasses

import pytest

import placement
from tests.described import described
from tests.unit.test_placement_expert_hits import QWEN3_MOE
from tests.unit.test_placement_routed_reads import _cpu_host

WORKLOAD = placement.WorkloadSpec(prompt_len=64, gen_len=8)
ON_GPU = placement.TierSplit(gpu=1, cpu=0, disk=0)


def _comp(hw, cache: placement.TierSplit, reads: bool = True) -> float:
    """A decode layer's compute; `reads=False`: with a disk read rate so fast its reads cost nothing."""
    hw = hw if reads else dataclasses.replace(hw, disk_read_bytes_per_s=1e30)
    policy = placement.Policy(gpu_batch_size=8, num_gpu_batches=1, cache=cache, activations=ON_GPU, weights=ON_GPU)
    return placement.predict(policy, described(QWEN3_MOE)[1], hw, WORKLOAD).decode_layer_s["comp"]


def test_on_a_host_device_a_disk_tier_caches_reads_are_the_compute_threads():
    """The step's compute with the cache on disk grows with the disk's read time; beside a GPU it does not."""
    hw = _cpu_host(2e10)
    on_disk = placement.TierSplit(gpu=0, cpu=0, disk=1)
    slow = dataclasses.replace(hw, disk_read_bytes_per_s=hw.disk_read_bytes_per_s / 2)
    grown = _comp(slow, on_disk) - _comp(hw, on_disk)
    assert grown > 0 and grown == pytest.approx(_comp(hw, on_disk) - _comp(hw, on_disk, reads=False), rel=1e-9)
    beside_a_gpu = dataclasses.replace(hw, gpu_is_host=False)  # a GPU's copies of the cache overlap its compute
    assert _comp(dataclasses.replace(slow, gpu_is_host=False), on_disk) == _comp(beside_a_gpu, on_disk)
