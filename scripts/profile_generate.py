"""Where a whole `generate` goes (prompt and decode of --batch prompts), as the 1.1B benchmark runs
it (scripts/bench_llamacpp_1b.py's worker: a warm-up, then one timed `LLM.generate_ids`): our native
kernels' CPU time by kernel and call shape (scripts/profile_decode.py's timing of each ctypes call;
the native decode loop's call counts as one line) and torch's ops (the profiler's self time, wall
clock); what neither holds is the Python that drives them.

    OMP_NUM_THREADS=1 python scripts/profile_generate.py --model FILE.gguf [--batch 32] \\
        [--prompt-len 128] [--new-tokens 32] [--threads 1] [--top 12]

CPU time is this one thread's (`time.thread_time`): at --threads 1 the whole run, and a busy
shared machine slows it less than it does wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import time_ours  # noqa: E402
from bench_prompts import distinct_prompts  # noqa: E402
from profile_decode import NativeTimes  # noqa: E402

from flexlamps import LLM  # noqa: E402


def report(wall: float, prefill: float, cpu: float, times: NativeTimes, prof, top: int) -> None:
    native = sum(times.seconds.values())
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    in_ops = sum(e.self_cpu_time_total for e in ops) / 1e6
    print(f"wall {wall:.1f} s (prompt {prefill:.1f} s, decode {wall - prefill:.1f} s); CPU {cpu:.1f} s, "
          f"our kernels {native:.1f} s of it ({native / cpu:.0%}); torch's ops {in_ops:.1f} s (the profiler's, "
          f"wall clock)")
    for (label, shape), seconds in sorted(times.seconds.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:8.2f} s  {times.calls[label, shape]:5d} calls  {label} {shape}")
    for e in ops[:top // 2]:
        print(f"  {e.self_cpu_time_total / 1e6:8.2f} s  {e.count:5d} calls  torch {e.key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the built-in name, a GGUF file or an HF folder")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=12, help="lines of native calls to list (half as many torch ops)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    times = NativeTimes()
    times.install()
    llm = LLM(args.model, max_batch_size=args.batch)
    time_ours(llm, distinct_prompts(llm.tokenizer, 1, args.prompt_len), 2)
    prompts = distinct_prompts(llm.tokenizer, args.batch, args.prompt_len)
    times.on = True
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.thread_time()
        wall, _, prefill = time_ours(llm, prompts, args.new_tokens)
        cpu = time.thread_time() - start
    times.on = False
    print(f"{args.model}, {llm.dtype}, batch {args.batch}, {args.prompt_len}-token prompts, {args.new_tokens} new, "
          f"{args.threads} thread(s)")
    report(wall, prefill, cpu, times, prof, args.top)


if __name__ == "__main__":
    main()
