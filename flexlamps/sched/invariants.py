"""Consistency checks of the scheduler's memory accounting, run every iteration by tests and
by the real engine's --check mode."""

from __future__ import annotations

from flexlamps.sched.request import Status, Strategy


def check_invariants(sched) -> None:
    """Raise AssertionError unless: each tier is within its capacity; a preserved request's
    cache is on the gpu tier, a swapped one's on the cpu tier, a discarded one's on neither;
    no waiting request went past the starvation threshold unpromoted."""
    bm = sched.bm
    assert bm.used_gpu_blocks <= bm.num_gpu_blocks, "gpu tier over capacity"
    assert bm.used_cpu_blocks <= bm.num_cpu_blocks, "cpu tier over its swap budget"
    assert sum(map(len, bm.gpu_tables.values())) == bm.used_gpu_blocks
    assert sum(map(len, bm.cpu_tables.values())) + bm.cpu_blocks_being_read == bm.used_cpu_blocks
    for req in sched.requests.values():
        rid, gpu, cpu = req.request_id, bm.num_gpu_blocks_of(req.request_id), bm.num_cpu_blocks_of(req.request_id)
        if req.status is Status.PAUSED and req.strategy is Strategy.PRESERVE:
            assert gpu == bm.blocks_held(req.num_computed) and cpu == 0, f"{rid}: preserved cache not on gpu"
        elif req.status is Status.SWAPPED or (req.status is Status.PAUSED and req.strategy is Strategy.SWAP):
            assert gpu == 0 and cpu == bm.blocks_held(req.num_computed), f"{rid}: swapped cache not on cpu"
        elif req.status is Status.WAITING or (req.status is Status.PAUSED and req.strategy is Strategy.DISCARD):
            assert gpu == 0 and cpu == 0 and req.num_computed == 0, f"{rid}: discarded cache still held"
        elif req.status is Status.RUNNING:
            assert cpu == 0 and gpu >= bm.blocks_held(req.num_computed), f"{rid}: running cache missing"
    t = sched.policy.starvation_threshold
    if t is None:
        return
    if sched.policy.starvation_counter == "pass_over":
        assert all(r.passed_over <= t for r in sched.waiting_requests()), \
            "a request was passed over past the threshold"
        return
    # promotion happens at the next schedule(): allow the iterations the last output covered
    late = [r.request_id for r in sched.waiting_requests() if r.status is Status.WAITING
            and not r.promoted and sched.iteration - r.starve_since >= t + sched.last_steps]
    assert not late, f"{late[:3]} waited past the starvation threshold without promotion"
