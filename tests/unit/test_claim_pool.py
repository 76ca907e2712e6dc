"""The decode and prompt kernels' thread split (`flexlamps/kernels/claim_pool.h`): chunks claimed by
the calling thread and the library's own workers give the bits of one thread at any thread count,
when two Python threads call at once (the second runs alone), and in a forked child (no workers:
its caller runs every chunk, without waiting for threads that are not there); the other kernels'
threads are the same pool's workers (pool_hook.h), not an OpenMP team of their own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

from flexlamps.kernels import tile_gemv
from quant.int4_weight import Int4Weight
from tests.kernel_variants import levels, variant_kernel

LEVELS = levels(tile_gemv.KERNEL)


def _weight(rows: int = 640, cols: int = 256) -> Int4Weight:
    gen = torch.Generator().manual_seed(1)
    return Int4Weight.quantize(torch.randn(rows, cols, generator=gen), 32, torch.bfloat16).kernel_only()


def _x(rows: int, cols: int = 256) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)


def _on_threads(threads: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def _products(kernel, w, x) -> tuple[torch.Tensor, ...]:
    """A decode row's, a decode batch's and a prompt's products (a prompt of more than 128 rows of 256
    rounds its x in several chunks too)."""
    return kernel.matmul(w, x[:1]), kernel.matmul(w, x[:40]), kernel.prompt_product(w, x)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("threads", [2, 3, 8])  # more threads than this box's cores too
def test_any_thread_count_gives_one_threads_bits(level, threads):
    kernel, w, x = variant_kernel(tile_gemv.KERNEL, level), _weight(), _x(300)
    alone = _on_threads(1, lambda: _products(kernel, w, x))
    for _ in range(3):  # calls back to back: workers still spinning on the last job, or woken
        split = _on_threads(threads, lambda: _products(kernel, w, x))
        assert all(torch.equal(a, b) for a, b in zip(alone, split))


@pytest.mark.parametrize("level", LEVELS)
def test_two_callers_at_once_get_their_own_products(level):
    """ctypes lets go of the GIL: two threads' calls overlap, the second while the pool serves the first."""
    kernel, x = variant_kernel(tile_gemv.KERNEL, level), _x(160)
    weights = [_weight(640), _weight(960)]
    want = [_on_threads(1, lambda w=w: _products(kernel, w, x)) for w in weights]
    got, errors = [[] for _ in weights], []

    def call(i: int) -> None:
        try:
            for _ in range(20):
                got[i].append(_products(kernel, weights[i], x))
        except Exception as err:  # noqa: BLE001  (reported by the assertion below)
            errors.append(err)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        callers = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for c in callers:
            c.start()
        for c in callers:
            c.join(60)
    finally:
        torch.set_num_threads(before)
    assert not errors and all(len(g) == 20 for g in got)
    assert all(torch.equal(a, b) for i in range(2) for pair in got[i] for a, b in zip(want[i], pair))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.parametrize("level", LEVELS)
def test_a_forked_child_computes_without_the_parents_workers(level):
    kernel, w, x = variant_kernel(tile_gemv.KERNEL, level), _weight(), _x(160)
    want = _on_threads(2, lambda: _products(kernel, w, x))  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # the child: a hang ends it by the alarm, a wrong product by its exit code
        signal.alarm(60)
        try:
            got = _on_threads(2, lambda: _products(kernel, w, x))
            os._exit(0 if all(torch.equal(a, b) for a, b in zip(want, got)) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"


_THREADS_AFTER = """
import os, sys, torch
from flexlamps.kernels import loader
kernels = loader.chosen()
gemv, att, ops = (kernels.get(name) for name in ("tile_gemv", "attention", "elementwise"))
if None in (gemv, att, ops):
    print("off"); sys.exit()
from quant.int4_weight import Int4Weight
w = Int4Weight.quantize(torch.randn(640, 256), 32, torch.bfloat16).kernel_only()
x, rows = torch.randn(4, 256).bfloat16(), torch.randn(64, 2048).bfloat16()
q, keys = torch.randn(8, 8, 1, 64).bfloat16(), torch.randn(8, 8, 160, 64).bfloat16()
mask = torch.ones(8, 1, 160, dtype=torch.bool)
torch.set_num_threads(2)
gemv.matmul(w, x)  # the pool's worker starts
before = len(os.listdir("/proc/self/task"))
att(q, keys, keys, mask)  # 64 (row, kv head) tasks
ops.rms_norm(rows, rows[0], 1e-5), ops.silu_mul(rows)  # 2^17 values
print(before, len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc here")
def test_the_attention_and_elementwise_kernels_split_on_the_pool_and_start_no_thread():
    """At 2 threads the attention (a decode's 8 x 8 kv heads) and the norm / SwiGLU (2^17 values)
    split on the workers the products started: no thread more. An OpenMP team of their own kept
    a thread spinning after each call on a core the pool's workers needed (a 2-core box's
    llama-3.2-1b decode at 2 threads: 291 ms of CPU a step, 161 with the team asleep)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", FLEXLAMPS_CPU_VARIANT="")
    out = subprocess.run([sys.executable, "-c", _THREADS_AFTER], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout.split()
    if out == ["off"]:
        pytest.skip("the native kernels do not run here")
    before, after = map(int, out)
    assert after == before
