"""Where a flexlamps decode step's time goes, per op: our native kernels (each call timed, by
kernel and shape), torch's ops (`engine.batch.step_profile`: the profiler's top-level ops) and the
rest (the Python that drives them), for each batch size, after a prompt of --prompt-len tokens.

Times are CPU time of the one thread (`time.thread_time`, at --threads 1 the default), so a busy
shared machine slows them less than it does wall time; a kernel's line is its calls' total a step.
torch's profiler does not see our kernels (ctypes calls): the bench's "outside torch's ops" figure
(scripts/bench_generate.py) is their time plus the Python's.

    python scripts/profile_decode.py [--model smollm2-135m] [--batch-sizes 1,32] [--steps 8] [--python-layers]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

import torch

from flexlamps import LLM
from flexlamps.engine.batch.step_profile import profile_decode_step
from flexlamps.engine.executors.step import Step
from flexlamps.kernels import loader

# kernel -> {ctypes attribute: (label, the arguments that name a call's shape)}
_CALLS = {
    "tile_gemv": {"_fn": ("decode product", lambda a: f"{a[5]}x{a[6]} rows {a[8]} x{a[12]}-bit"),
                  "_gemm": ("prompt product", lambda a: f"{a[4]}x{a[5]} rows {a[7]}")},
    "attention": {"_fn": ("attention", lambda a: f"rows {a[5]} heads {a[6]}/{a[7]} queries {a[8]}")},
    "elementwise": {"_norm": ("rms_norm", lambda a: f"{a[3]}x{a[4]}"),
                    "_silu_mul": ("silu_mul", lambda a: f"{a[2]}x{a[3]}")},
    # the native decode loop (models/blocks/native_decode.py): every layer's kernels in one call, timed as one
    "decode_layers": {"_fn": ("decode layers (every layer's kernels)", lambda a: f"rows {a[1]._obj.rows} layers {a[3]}")},
}


class NativeTimes:
    """CPU seconds and calls of each native kernel call, by (label, shape), while `on`."""

    def __init__(self):
        self.seconds, self.calls, self.on = defaultdict(float), Counter(), False

    def install(self) -> None:
        """Wrap this process's kernels' ctypes functions (before a model binds them)."""
        for name, calls in _CALLS.items():
            kernel = loader.chosen().get(name)
            for attr, (label, shape) in calls.items() if kernel is not None else ():
                setattr(kernel, attr, self._timed(getattr(kernel, attr), label, shape))

    def _timed(self, fn, label: str, shape):
        def call(*args):
            if not self.on:
                return fn(*args)
            start = time.thread_time()
            out = fn(*args)
            key = (label, shape(args))
            self.seconds[key] += time.thread_time() - start
            self.calls[key] += 1
            return out
        return call


def timed_steps(executor, times: NativeTimes, batch: int, prompt_len: int, steps: int) -> float:
    """Median CPU seconds of `steps` decode steps of `batch` rows after a prompt, the native calls
    timed meanwhile (totals over the steps)."""
    cache = executor.new_cache(batch, prompt_len + steps + 2)
    rows = torch.arange(batch)
    executor.forward_steps(cache, [Step(torch.full((batch, prompt_len), 5), torch.arange(prompt_len).expand(batch, -1),
                                        rows, torch.full((batch,), prompt_len - 1))])
    spent = []
    for i in range(steps + 1):  # the first step binds the decode products: not counted
        times.on = i > 0
        step = Step(torch.full((batch, 1), 5), torch.full((batch, 1), prompt_len + i), rows, torch.zeros(batch, dtype=torch.long))
        start = time.thread_time()
        executor.forward_steps(cache, [step])
        spent.append(time.thread_time() - start)
    times.on = False
    cache.release()
    return sorted(spent[1:])[steps // 2]


def report(executor, times: NativeTimes, batch: int, prompt_len: int, steps: int) -> None:
    times.seconds.clear()
    times.calls.clear()
    step = timed_steps(executor, times, batch, prompt_len, steps)
    torch_ops = profile_decode_step(executor, batch, prompt_len, steps)
    native = sum(times.seconds.values()) / steps
    rest = step - native - torch_ops.in_ops_s
    print(f"\nbatch {batch}: step {step * 1e3:.1f} ms CPU time: our kernels {native * 1e3:.1f} ms ({native / step:.0%}), "
          f"torch's ops {torch_ops.in_ops_s * 1e3:.1f} ms ({torch_ops.ops_per_step} a step), "
          f"the rest (Python) {rest * 1e3:.1f} ms ({rest / step:.0%})")
    for (label, shape), seconds in sorted(times.seconds.items(), key=lambda kv: -kv[1]):
        calls = times.calls[label, shape] // steps
        print(f"  {seconds / steps * 1e3:8.2f} ms  {calls:4d} calls  {label} {shape}")
    for name, calls, seconds in torch_ops.top_ops[:8]:
        print(f"  {seconds * 1e3:8.2f} ms  {calls:4d} calls  torch {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="the built-in name, a GGUF file or an HF folder")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed (the median counts) and profiled")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--python-layers", action="store_true",
                    help="run decode's layers from Python (not the native loop): each kernel call timed on its own")
    args = ap.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    torch.set_num_threads(args.threads)
    times = NativeTimes()
    times.install()
    llm = LLM(args.model, dtype=args.dtype, max_batch_size=max(batches))
    if args.python_layers:
        llm.executor.native_layers = None
    print(f"{args.model}, {llm.dtype}, {args.threads} thread(s); kernels: "
          + ", ".join(f"{k} {getattr(loader.chosen().get(k), 'level', 'off')}" for k in _CALLS))
    for batch in batches:
        report(llm.executor, times, batch, args.prompt_len, args.steps)


if __name__ == "__main__":
    main()
