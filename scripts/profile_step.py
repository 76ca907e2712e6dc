"""A decode step of the in-memory engine, taken apart: wall and CPU time, the time inside torch's
ops, the Python overhead between them, ops dispatched per step and per layer, the slowest ops.

    python scripts/profile_step.py [--model smollm2-135m] [--dtype auto] [--batch-sizes 1,32] \\
        [--prompt-len 128] [--steps 16] [--threads 1] [--top 12]

See flexlamps.engine.batch.step_profile for how each figure is measured (best of --steps steps).
"""

from __future__ import annotations

import argparse
import os

import torch

from flexlamps import LLM
from flexlamps.engine.batch.step_profile import profile_decode_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", default="1")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=12, help="slowest ops to list")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    llm = LLM(args.model, dtype=args.dtype, max_batch_size=max(batches))
    layers = llm.config.num_layers
    for batch in batches:
        p = profile_decode_step(llm.executor, batch, args.prompt_len, args.steps)
        print(f"{args.model} {llm.dtype} batch {batch}, after {args.prompt_len} tokens, {args.threads} thread(s), "
              f"load avg {os.getloadavg()[0]:.1f}: decode step {p.wall_s * 1e3:.2f} ms wall "
              f"({p.cpu_s * 1e3:.2f} ms CPU), {p.in_ops_s * 1e3:.2f} ms in torch ops, outside them (Python, our native kernels) "
              f"{p.python_s * 1e3:.2f} ms ({p.python_s / p.step_s:.0%}); {p.ops_per_step} ops dispatched "
              f"({p.ops_per_step / layers:.0f} per layer of {layers})")
        for name, calls, seconds in p.top_ops[:args.top]:
            print(f"    {name:<40} {calls:>5} calls {seconds * 1e3:>7.2f} ms  ({seconds / calls * 1e6:.1f} us each)")


if __name__ == "__main__":
    main()
