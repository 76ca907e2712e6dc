"""A decode step of the in-memory engine (or, with --offload-dir, the offload executor), taken apart: wall and CPU time, the time inside torch's
ops, the Python overhead between them, ops dispatched per step and per layer, the slowest ops.

    python scripts/profile_step.py [--model smollm2-135m] [--dtype auto] [--batch-sizes 1,32] \\
        [--prompt-len 128] [--steps 16] [--threads 1] [--top 12] [--kernel-time] [--python-layers] \\
        [--offload-dir DIR --gpu-mem BYTES --cpu-mem BYTES]

With --offload-dir the step is the offload executor's (`--policy auto` under the two budgets, as
`scripts/bench_moe.py` runs flexlamps), else the in-memory engine's.

See flexlamps.engine.batch.step_profile for how each figure is measured (best of --steps steps).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from flexlamps import LLM
from flexlamps.engine.batch.step_profile import profile_decode_step
from flexlamps.kernels import tile_gemv

KERNEL_CPU_S = [0.0]  # CPU seconds inside the decode kernel's calls (with --kernel-time)


def time_the_decode_kernel() -> None:
    """Count the CPU time of every call of the decode kernel's products (`TileGemv.bind`) in
    KERNEL_CPU_S: what torch's profiler does not see."""
    bind = tile_gemv.TileGemv.bind

    def timed_bind(self, w):
        product = bind(self, w)

        def timed(x):
            start = time.thread_time()
            out = product(x)
            KERNEL_CPU_S[0] += time.thread_time() - start
            return out

        timed.weight = w
        return timed

    tile_gemv.TileGemv.bind = timed_bind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", default="1")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=12, help="slowest ops to list")
    ap.add_argument("--kernel-time", action="store_true",
                    help="also time the decode kernel's calls (CPU time a step, over the plain and the profiled steps)")
    ap.add_argument("--python-layers", action="store_true",
                    help="run the in-memory engine's decode layers from Python, not the native loop (models/blocks/native_decode.py)")
    ap.add_argument("--offload-dir", help="profile the offload executor, its weights placed by the planner")
    ap.add_argument("--gpu-mem", type=int, default=0, help="with --offload-dir: the gpu tier's bytes")
    ap.add_argument("--cpu-mem", type=int, default=0, help="with --offload-dir: the cpu tier's bytes")
    args = ap.parse_args()
    if args.kernel_time:
        time_the_decode_kernel()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    budgets = dict(gpu_mem=args.gpu_mem, cpu_mem=args.cpu_mem, offload_dir=args.offload_dir, policy="auto") \
        if args.offload_dir else {}
    llm = LLM(args.model, dtype=args.dtype, max_batch_size=max(batches), **budgets)
    if args.python_layers and not args.offload_dir:
        llm.executor.native_layers = None
    if args.offload_dir:
        llm.prepare(prompt_len=args.prompt_len, gen_len=2 * args.steps + 1, num_sequences=max(batches))
    layers = llm.config.num_layers
    for batch in batches:
        KERNEL_CPU_S[0] = 0.0
        p = profile_decode_step(llm.executor, batch, args.prompt_len, args.steps)
        if args.kernel_time:  # the prefill's calls are prompt products, not counted
            print(f"  decode kernel (tile_gemv): {KERNEL_CPU_S[0] / (2 * args.steps) * 1e3:.2f} ms CPU a step "
                  f"(mean of {2 * args.steps} steps; the prefill's one head call counted too)")
        print(f"{args.model} {llm.dtype} batch {batch}, after {args.prompt_len} tokens, {args.threads} thread(s), "
              f"load avg {os.getloadavg()[0]:.1f}: decode step {p.wall_s * 1e3:.2f} ms wall "
              f"({p.cpu_s * 1e3:.2f} ms CPU), {p.in_ops_s * 1e3:.2f} ms in torch ops, outside them (Python, our native kernels) "
              f"{p.python_s * 1e3:.2f} ms ({p.python_s / p.step_s:.0%}); {p.ops_per_step} ops dispatched "
              f"({p.ops_per_step / layers:.0f} per layer of {layers})")
        for name, calls, seconds in p.top_ops[:args.top]:
            print(f"    {name:<40} {calls:>5} calls {seconds * 1e3:>7.2f} ms  ({seconds / calls * 1e6:.1f} us each)")


if __name__ == "__main__":
    main()
