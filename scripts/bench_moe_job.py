"""A whole offline job on the MoE bench's model (`bench_moe_checkpoint`), every side under one
memory cap: N prompts of --prompt-len tokens, --gen-len new tokens each.

- flexlamps: `generate`'s path (`LLM.prepare` for the job's N sequences, then every prompt in one
  call), `--policy auto` choosing how many sequences share a sweep, its budgets filling the cap
  (`--gpu-mem`, and the cpu tier what the cap leaves: `generate --max-rss`'s rule);
- llama.cpp: `llama-batched-bench` over `--npl` (sequences decoded in parallel), the best of them;
  its job rate is that setting's (npl x new tokens) / (its prefill + decode time);
- Accelerate's disk offload: `generate` on one batch of --accelerate-batch prompts, its job rate
  extrapolated (the job is N / batch such batches in a row).

Printed: each side's job tok/s (generated tokens over wall time), disk bytes read per generated
token, and flexlamps' plan (sequences per sweep, predicted tok/s). `--blocks 1,8,64` runs
flexlamps alone with its sequences per sweep capped at each (the curve of docs/performance.md).

    python scripts/bench_moe_job.py --small --job 64 --blocks 1,4,16,64
    python scripts/bench_moe_job.py --job 1000 --llama-cpp /path/to/llama-batched-bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from bench_moe import _prompts, accelerate_model
from bench_moe_checkpoint import build_gguf, build_hf
from bench_moe_peers import MemoryCap, drop_page_cache, io_counters, llama_jsonl_row, run_capped


def worker_flexlamps(args) -> dict:
    """The job through `generate`'s path, at most `args.block` sequences a sweep (the job's size: the planner's choice)."""
    from flexlamps import LLM, SamplingParams

    llm = LLM(str(args.model), dtype="bfloat16", gpu_mem=args.gpu_mem, cpu_mem=args.cpu_mem,
              offload_dir=str(args.offload_dir), policy="auto")
    llm.prepare(prompt_len=args.prompt_len, gen_len=args.gen_len, num_sequences=args.block)
    prompts = _prompts(args.job, args.prompt_len, llm.config.vocab_size)
    drop_page_cache(args.model, args.offload_dir)
    before, started, cpu_started = io_counters(), time.perf_counter(), time.process_time()
    llm.generate_ids(prompts, [SamplingParams(max_new_tokens=args.gen_len, ignore_eos=True)] * len(prompts))
    seconds, cpu_s, after = time.perf_counter() - started, time.process_time() - cpu_started, io_counters()
    plan, policy = llm.plan, llm.policy
    llm.close()
    return {"s": seconds, "cpu_s": cpu_s, "read_bytes": after["read_bytes"] - before["read_bytes"], "block": policy.block_size,
            "expert_group": policy.expert_group, "predicted_tps": plan.tokens_per_s if plan else None,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cache_on_disk": policy.cache.disk, "weights_in_memory": 1 - policy.weights.disk}


def worker_accelerate(args) -> dict:
    """One batch of `args.block` prompts through transformers' generate with Accelerate's offload."""
    import torch

    model = accelerate_model(args)
    ids = torch.tensor(_prompts(args.block, args.prompt_len, model.config.vocab_size))
    drop_page_cache(args.model, args.offload_dir / "accelerate")
    before, started = io_counters(), time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.gen_len,
                       min_new_tokens=args.gen_len, do_sample=False, pad_token_id=0)
    return {"s": time.perf_counter() - started, "read_bytes": io_counters()["read_bytes"] - before["read_bytes"]}


def llama_cpp_best(args, cap: MemoryCap) -> dict:
    """llama-batched-bench at every --npl; the setting with the best job rate."""
    best = None
    for npl in (int(n) for n in args.npl.split(",")):
        drop_page_cache(args.gguf)
        cmd = [args.llama_cpp, "-m", str(args.gguf), "-c", str(npl * (args.prompt_len + args.gen_len) + 16),
               "-b", "2048", "-ub", "512", "-npp", str(args.prompt_len), "-ntg", str(args.gen_len), "-npl", str(npl),
               "-t", str(args.threads), "--output-format", "jsonl"]
        row, read = llama_jsonl_row(cap, cmd, args.timeout)
        tps = npl * args.gen_len / row["t"]
        print(f"  llama.cpp -npl {npl}: {tps:.2f} tok/s (prefill + decode of {npl} sequences in {row['t']:.1f} s, "
              f"{row['t'] / npl:.2f} s a prompt)", flush=True)
        if best is None or tps > best["tps"]:
            best = {"tps": tps, "npl": npl, "read_per_token": read["read_bytes"] / (npl * args.gen_len)}
    return best


def _capped_worker(args, cap: MemoryCap, side: str, block: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", side, "--block", str(block), *_shared_flags(args)]
    out, _, _ = run_capped(cap, cmd, args.timeout)
    return json.loads(out.strip().splitlines()[-1])


def _shared_flags(args) -> list[str]:
    return ["--model", str(args.model), "--offload-dir", str(args.offload_dir), "--job", str(args.job),
            "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len), "--gpu-mem", str(args.gpu_mem),
            "--cpu-mem", str(args.cpu_mem), "--threads", str(args.threads)]


def _flexlamps_line(res: dict, job: int, gen_len: int) -> tuple[float, str]:
    tokens = job * gen_len
    tps = tokens / res["s"]
    predicted = f", measured/predicted {tps / res['predicted_tps']:.2f}" if res["predicted_tps"] else ""
    return tps, (f"  flexlamps  {res['block']:5d} sequences a sweep (experts {'streamed' if res['expert_group'] else 'staged'}): "
                 f"{tps:8.2f} tok/s, disk {res['read_bytes'] / tokens / 2**20:7.2f} MiB a token{predicted}; "
                 f"{res['s'] / job:.2f} s a prompt ({res['cpu_s'] / job:.2f} s of CPU, all threads); "
                 f"weights {res['weights_in_memory']:.0%} in memory, cache {res['cache_on_disk']:.0%} on disk, "
                 f"peak RSS {res['peak_rss'] / 2**20:.0f} MiB")


def measure_profile(args) -> None:
    """The machine profile flexlamps' `--policy auto` plans with, measured here (unless cached) at the
    job's thread count before any side runs: its probes stay out of the capped, timed worker and its peak RSS."""
    import torch

    from flexlamps.hardware.cache import machine_profile
    from flexlamps.models.description import model_spec
    from flexlamps.models.loading.registry import open_checkpoint

    torch.set_num_threads(args.threads)
    spec = model_spec(open_checkpoint(str(args.model)).config)
    machine_profile(args.offload_dir, lambda path, why: print(f"measuring {path} ({why})", flush=True),
                    model_shapes=spec.layer_matrix_shapes(), expert_dims=spec.routed_expert_dims())


def run(args) -> None:
    measure_profile(args)
    cap = MemoryCap(args.cap)
    print(f"job {args.job} prompts x ({args.prompt_len} + {args.gen_len}); {cap.describe()}; flexlamps gpu "
          f"{args.gpu_mem / 2**20:.0f} MiB + cpu {args.cpu_mem / 2**20:.0f} MiB; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        results = {}
        blocks = [int(b) for b in args.blocks.split(",")] if args.blocks else [args.job]
        for block in blocks if "flexlamps" in args.sides else []:
            tps, line = _flexlamps_line(_capped_worker(args, cap, "flexlamps", block), args.job, args.gen_len)
            print(line, flush=True)
            results["flexlamps"] = max(tps, results.get("flexlamps", 0.0))
        if "accelerate" in args.sides:
            res = _capped_worker(args, cap, "accelerate", args.accelerate_batch)
            results["accelerate"] = args.accelerate_batch * args.gen_len / res["s"]
            print(f"  accelerate batch {args.accelerate_batch}: {results['accelerate']:.2f} tok/s", flush=True)
        if "llama.cpp" in args.sides and args.llama_cpp:
            results["llama.cpp"] = llama_cpp_best(args, cap)["tps"]
        for side in ("llama.cpp", "accelerate"):
            if side in results and "flexlamps" in results:
                print(f"  flexlamps / {side}: {results['flexlamps'] / results[side]:.2f}x")
    finally:
        cap.close()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def _args() -> argparse.Namespace:
    from flexlamps.commands.memory import cpu_mem_within

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="the 55 MB model")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "flexlamps" / "bench-moe")
    ap.add_argument("--job", type=int, default=1000, help="prompts in the job")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--blocks", default=None, help="flexlamps alone, sequences a sweep capped at each (comma-separated)")
    ap.add_argument("--sides", default="flexlamps,llama.cpp,accelerate")
    ap.add_argument("--llama-cpp", default=None, help="llama.cpp's llama-batched-bench executable")
    ap.add_argument("--npl", default="1,8,32,64,128,256", help="llama.cpp's parallel settings tried")
    ap.add_argument("--accelerate-batch", type=int, default=8)
    ap.add_argument("--cap", type=int, default=None, help="bytes of the memory cap (default 3.5 GiB; --small 200 MiB"
                                                          " over the overhead)")
    ap.add_argument("--gpu-mem", type=int, default=None, help="bytes (default: an eighth of the model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--timeout", type=float, default=7200.0)
    for hidden in ("--worker", "--model"):
        ap.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--offload-dir", default=None, help="flexlamps' offload folder (default: offload-SIZE in --cache-dir)")
    ap.add_argument("--cpu-mem", type=int, default=None, help="bytes (default: what the cap leaves flexlamps)")
    ap.add_argument("--block", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is None:
        size = "small" if args.small else "full"
        args.model = build_hf(args.cache_dir / size, size)
        args.gguf = build_gguf(args.model, args.cache_dir / f"{size}.gguf") if args.llama_cpp else None
        args.offload_dir = Path(args.offload_dir or args.cache_dir / f"offload-{size}")
        model_bytes = sum(p.stat().st_size for p in args.model.glob("*.safetensors"))
        args.gpu_mem = args.gpu_mem or model_bytes // 8
        args.cap = args.cap or (3584 << 20 if not args.small else (650 << 20))
        args.cpu_mem = args.cpu_mem or cpu_mem_within(args.cap, args.gpu_mem, gpu_is_host=True)  # --max-rss's rule
    return args


def main() -> None:
    args = _args()
    if args.worker:
        args.model, args.offload_dir = Path(args.model), Path(args.offload_dir)
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps({"flexlamps": worker_flexlamps, "accelerate": worker_accelerate}[args.worker](args)))
        return
    run(args)


if __name__ == "__main__":
    main()
