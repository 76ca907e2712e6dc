"""What the offload sweep's heap policy costs and saves: `release_heap` (glibc's malloc_trim) after a
prompt sweep's every layer and a decode sweep's last (`sweep.trims_heap_after`), against trimming after
every decode layer too, alternating in one process on the MoE job's model and budgets (`bench_moe_job.py`'s
defaults: gpu an eighth of the model, cpu what a 3.5 GiB cap leaves). Printed per variant and round:
prompt and decode sweeps' seconds, decode tok/s, the trims' own seconds (calls, median, max), the largest
RssAnon before a sweep's last trim and the run's minor page faults (a trimmed page the next layer uses
again is faulted back in: the trims' cost beyond their own time); then decode tok/s every layer / the policy.

    python scripts/bench_heap_trim.py --sample 8 --gen-len 16 --rounds 2
    python scripts/bench_heap_trim.py --small
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from bench_moe import _prompts
from bench_moe_checkpoint import build_hf


def rss_anon_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024


def one_run(llm, sweep_module, prompts, gen_len: int, every_layer: bool) -> dict:
    """One `generate_ids` call, each trim timed; `every_layer`: a decode sweep's layers all trim too."""
    from flexlamps import SamplingParams

    sweep, policy, real = llm.executor.sweep, sweep_module.trims_heap_after, sweep_module.release_heap
    log = {"trim_s": [], "rss": 0.0}

    def decide(layer: int, layers: int, prefill: bool, micro_batch_workspace: int | None = None, **free) -> bool:
        if micro_batch_workspace is not None:  # between a layer's micro-batches: the policy's word
            return policy(layer, layers, prefill, micro_batch_workspace)
        if layer == layers - 1:
            log["rss"] = max(log["rss"], rss_anon_mib())
        return every_layer or policy(layer, layers, prefill, **free)

    def trim() -> bool:
        t = time.perf_counter()
        real()
        log["trim_s"].append(time.perf_counter() - t)
        return True
    sweep_module.trims_heap_after, sweep_module.release_heap, sweep.profiles = decide, trim, []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        llm.generate_ids(prompts, [SamplingParams(max_new_tokens=gen_len, ignore_eos=True)] * len(prompts))
    finally:
        sweep_module.trims_heap_after, sweep_module.release_heap = policy, real
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    prompt_s = sum(p.sweep_s for p in sweep.profiles if p.prefill)
    decode = [p.sweep_s for p in sweep.profiles if not p.prefill]
    return {"prompt_s": prompt_s, "decode_s": sum(decode), "decode_tps": len(prompts) * (gen_len - 1) / sum(decode),
            "trims": len(log["trim_s"]), "trim_s": sum(log["trim_s"]),
            "trim_med_ms": 1e3 * statistics.median(log["trim_s"]), "trim_max_ms": 1e3 * max(log["trim_s"]),
            "rss_mib": log["rss"], "faults": faults}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("--sample", 8), ("--prompt-len", 128), ("--gen-len", 16), ("--rounds", 2), ("--threads", 1)):
        ap.add_argument(name, type=int, default=default)  # --sample prompts, all in one call
    ap.add_argument("--small", action="store_true", help="the 55 MB model")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "flexlamps" / "bench-moe")
    args = ap.parse_args()
    import torch

    from flexlamps import LLM
    from flexlamps.commands.memory import cpu_mem_within
    from flexlamps.engine.executors import sweep as sweep_module

    torch.set_num_threads(args.threads)
    size = "small" if args.small else "full"
    model = build_hf(args.cache_dir / size, size)
    gpu_mem = sum(p.stat().st_size for p in model.glob("*.safetensors")) // 8
    cpu_mem = cpu_mem_within(3584 << 20 if not args.small else 650 << 20, gpu_mem, gpu_is_host=True)
    llm = LLM(str(model), dtype="bfloat16", gpu_mem=gpu_mem, cpu_mem=cpu_mem,
              offload_dir=str(args.cache_dir / f"offload-{size}"), policy="auto")
    llm.prepare(prompt_len=args.prompt_len, gen_len=args.gen_len, num_sequences=args.sample)
    llm.executor.sweep.record_profile = True
    prompts = _prompts(args.sample, args.prompt_len, llm.config.vocab_size)
    print(f"{size} model, {args.sample} x ({args.prompt_len} + {args.gen_len}), threads {args.threads}, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    tps = {True: [], False: []}
    for r in range(args.rounds):
        for every_layer in ((True, False) if r % 2 == 0 else (False, True)):  # neither always first
            res = one_run(llm, sweep_module, prompts, args.gen_len, every_layer)
            tps[every_layer].append(res["decode_tps"])
            print(f"round {r} {'every layer ' if every_layer else 'the policy '}: prompt {res['prompt_s']:.2f} s, "
                  f"decode {res['decode_s']:.2f} s ({res['decode_tps']:.2f} tok/s); {res['trims']} trims "
                  f"{res['trim_s']:.3f} s (median {res['trim_med_ms']:.2f} ms, max {res['trim_max_ms']:.2f} ms); "
                  f"RssAnon before a sweep's last trim <= {res['rss_mib']:.0f} MiB; {res['faults']} minor page faults; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    llm.close()
    print(f"decode tok/s every layer / the policy: {statistics.median(tps[True]) / statistics.median(tps[False]):.3f}")


if __name__ == "__main__":
    main()
