"""A prompt sweep's memory, layer step by layer step, against what the step is charged: the MoE job's
model and budgets by default (`bench_moe_job.py`: gpu 626 + cpu 2508 MiB, the plan for 1008 prompts of
128 tokens), MICRO_BATCHES micro-batches of the plan's rows through every layer.

Default: per layer step, the resident set (RssAnon before, after and its peak: VmHWM reset before the
step, less the mapped file pages), glibc's heap (arena, in use, free), the budgets and the charged
workspace. --no-trim leaves out the heap trims between a layer's micro-batches (what the sweep did
before `trims_heap_after(..., micro_batch_workspace)`). --by-op: torch's own allocations instead (the
profiler's allocation events), the first layer step's peak and every allocation of 1 MiB or more with
the op that made it and the running total.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/probe_prompt_transients.py [--model DIR] [--micro-batches 6] [--by-op]
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from flexlamps import LLM
from flexlamps.engine.executors import sweep as sweep_module
from flexlamps.engine.executors.step import Step

MiB = 1 << 20
_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _status() -> dict[str, int]:
    """RssAnon, RssFile and VmHWM in MiB."""
    with open("/proc/self/status") as fh:
        return {k: int(v.split()[0]) // 1024 for k, v in (line.split(":", 1) for line in fh)
                if k in ("RssAnon", "RssFile", "VmHWM")}


def _heap() -> tuple[int, int, int]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return m.arena // MiB, m.uordblks // MiB, m.fordblks // MiB


def _counting_reads(store) -> list[int]:
    """Wrap `store`'s disk-read buffers (the staged copies a fetch makes on a CPU-only machine) to
    add their bytes to the returned one-element list."""
    read, made = store._read_buffer, [0]

    def counted(shape, dtype):
        buf = read(shape, dtype)
        made[0] += buf.numel() * buf.element_size()
        return buf
    store._read_buffer = counted
    return made


def _resident_step(layer_step, disk_reads: list[int]):
    def step(self, j, w, s, *rest):
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # VmHWM from the resident set now
        gpu = self.budgets["gpu"]
        before, heap0, used0, cached0, disk_reads[0] = _status(), _heap(), gpu.used_bytes, gpu.cached_bytes, 0
        gpu.reset_peak()
        ws = layer_step(self, j, w, s, *rest)
        after, heap1 = _status(), _heap()
        peak = after["VmHWM"] - max(before["RssFile"], after["RssFile"])
        print(f"layer {j}: workspace {self._workspace_bytes(s, s.span) // MiB} MiB | RssAnon {before['RssAnon']} -> "
              f"{after['RssAnon']}, peak {peak} (+{peak - before['RssAnon']}) | heap arena {heap0[0]} -> {heap1[0]}, "
              f"in use {heap0[1]} -> {heap1[1]}, free {heap0[2]} -> {heap1[2]} | gpu used {used0 // MiB} -> "
              f"{gpu.used_bytes // MiB}, peak +{(gpu.peak_bytes - used0) // MiB}, cached {cached0 // MiB} -> "
              f"{gpu.cached_bytes // MiB}; disk reads staged {disk_reads[0] // MiB} MiB | cpu used "
              f"{self.budgets['cpu'].used_bytes // MiB}", flush=True)
        return ws
    return step


def _by_op(ex, cache, steps) -> None:
    layer_step = sweep_module.Sweep._layer_step

    def marked(self, *args):
        with record_function("layer_step"):
            return layer_step(self, *args)

    sweep_module.Sweep._layer_step = marked
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        ex.forward_steps(cache, steps)
    events = prof.profiler.kineto_results.events()
    start, end = min((e.start_ns(), e.end_ns()) for e in events if e.name() == "layer_step")  # the first
    ops = sorted((e.start_ns(), e.end_ns(), e.name(), e.shapes()) for e in events
                 if e.name() not in ("[memory]", "layer_step") and start <= e.start_ns() <= end)
    live = peak = 0
    for t, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        if not start <= t <= end:
            continue
        live += nbytes
        peak = max(peak, live)
        if abs(nbytes) >= MiB:
            inner = [o for o in ops if o[0] <= t <= o[1]]
            name, shapes = (inner[-1][2], inner[-1][3]) if inner else ("(freed)", "")
            print(f"{live / MiB:9.1f} {nbytes / MiB:+8.1f}  {name} {shapes}")
    print(f"layer 0's step: peak of torch's allocations {peak / MiB:.1f} MiB, charged "
          f"{ex.sweep._workspace_bytes(steps[0], steps[0].span) / MiB:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path.home() / ".cache/flexlamps/bench-moe/full"))
    ap.add_argument("--micro-batches", type=int, default=6)
    ap.add_argument("--offload-dir", default=str(Path.home() / ".cache/flexlamps/bench-moe/offload-full"))
    ap.add_argument("--by-op", action="store_true")
    ap.add_argument("--no-trim", action="store_true")
    args = ap.parse_args()
    llm = LLM(args.model, dtype="bfloat16", gpu_mem=626 * MiB, cpu_mem=2508 * MiB,
              offload_dir=args.offload_dir, policy="auto")
    llm.prepare(prompt_len=128, gen_len=64, num_sequences=1008)
    rows, ex = llm.policy.gpu_batch_size, llm.executor
    gen = torch.Generator().manual_seed(3)
    micro_batches = 1 if args.by_op else args.micro_batches
    steps = [Step(torch.randint(2, llm.config.vocab_size, (rows, 128), generator=gen), torch.arange(128).expand(rows, 128),
                  torch.arange(k * rows, (k + 1) * rows)) for k in range(micro_batches)]
    cache = ex.new_cache(rows * micro_batches, 129)
    if args.by_op:
        _by_op(ex, cache, steps)
        return
    if args.no_trim:
        policy = sweep_module.trims_heap_after
        sweep_module.trims_heap_after = lambda j, n, prefill, micro_batch_workspace=None, **free: \
            micro_batch_workspace is None and policy(j, n, prefill, **free)
    sweep_module.Sweep._layer_step = _resident_step(sweep_module.Sweep._layer_step, _counting_reads(ex.store))
    ex.forward_steps(cache, steps)


if __name__ == "__main__":
    main()
