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
token, and flexlamps' plan (sequences per sweep, predicted tok/s) with each phase's time measured
against its price. `--blocks 1,8,64` runs flexlamps alone with its sequences per sweep capped at
each (the curve of docs/performance.md). A job too long to run whole is projected from a sample
(`bench_moe_job_sample`: `--sample K` prompts for flexlamps, `--peer-gen G` new tokens a peer's batch).

    python scripts/bench_moe_job.py --small --job 64 --blocks 1,4,16,64
    python scripts/bench_moe_job.py --job 1000 --llama-cpp /path/to/llama-batched-bench
    python scripts/bench_moe_job.py --job 1000 --sample 16 --peer-gen 8 --npl 64,256 --llama-cpp PATH
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

from bench_moe import _prompts, _timed, accelerate_model
from bench_moe_checkpoint import build_gguf, build_hf
from bench_moe_job_sample import accelerate_job_s, flexlamps_job_s, llama_cpp_job_s
from bench_moe_peers import MemoryCap, drop_page_cache, io_counters, llama_jsonl_row, run_capped


def worker_flexlamps(args) -> dict:
    """The job's first `args.sample` prompts (all of them by default) through `generate`'s path, at most
    `args.block` sequences a sweep (the job's size: the planner's choice); with the job's own plan's price."""
    from flexlamps import LLM, SamplingParams

    llm = LLM(str(args.model), dtype="bfloat16", gpu_mem=args.gpu_mem, cpu_mem=args.cpu_mem,
              offload_dir=str(args.offload_dir), policy="auto")
    llm.prepare(prompt_len=args.prompt_len, gen_len=args.gen_len, num_sequences=min(args.block, args.sample))
    prompts = _prompts(args.sample, args.prompt_len, llm.config.vocab_size)
    drop_page_cache(args.model, args.offload_dir)
    llm.executor.sweep.record_profile = True
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    before, started, cpu_started = io_counters(), time.perf_counter(), time.process_time()
    llm.generate_ids(prompts, [SamplingParams(max_new_tokens=args.gen_len, ignore_eos=True)] * len(prompts))
    seconds, cpu_s, after = time.perf_counter() - started, time.process_time() - cpu_started, io_counters()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults
    plan, policy = llm.plan, llm.policy
    phases = measured_phases(llm.executor.sweep.profiles)
    job_phases = job_plan_phases(llm, args) if args.sample < args.job else None
    llm.close()
    return {"s": seconds, "cpu_s": cpu_s, "read_bytes": after["read_bytes"] - before["read_bytes"], "block": policy.block_size,
            "expert_group": policy.expert_group, "predicted_tps": plan.tokens_per_s if plan else None,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cache_on_disk": policy.cache.disk, "weights_in_memory": 1 - policy.weights.disk,
            "phases": phases, "major_faults": faults, "job_phases": job_phases,
            "predicted_phases": predicted_phases(plan, -(-args.sample // policy.block_size))}


def job_plan_phases(llm, args) -> dict | None:
    """The price per phase of the whole job's plan (`args.job` prompts, at most `args.block` a sweep), planned
    as `generate` would plan it, without running it (`bench_moe_job_sample.flexlamps_job_s`)."""
    from flexlamps.run_plan.build import machine_inputs
    from flexlamps.run_plan.plan import Workload, plan_run

    workload = Workload(prompt_len=args.prompt_len, gen_len=args.gen_len, num_sequences=min(args.job, args.block))
    settings = llm.offload or llm.settings
    run_plan = plan_run(settings, llm.config, llm.model_spec, llm.dtype, workload,
                        **machine_inputs(settings, llm.model_spec, llm.reader))
    phases = predicted_phases(run_plan.predicted, -(-args.job // run_plan.policy.block_size))
    return phases and {**phases, "block": run_plan.policy.block_size}


def measured_phases(profiles) -> dict:
    """The sweeps' seconds by phase (a sweep with a prompt in it is prefill): wall, waiting on reads, compute,
    and the sweep thread's CPU and wait for a core (the rest of the wall it was blocked: faults, reads)."""
    out = {}
    for phase in ("prefill", "decode"):
        sweeps = [p for p in profiles if p.prefill == (phase == "prefill")]
        out[phase] = {"s": sum(p.sweep_s for p in sweeps), "io_wait_s": sum(sum(p.io_wait_s) for p in sweeps),
                      "compute_s": sum(sum(p.compute_s) for p in sweeps), "io_s": sum(sum(p.io_s) for p in sweeps),
                      "cpu_s": sum(p.cpu_s for p in sweeps), "run_queue_s": sum(p.run_queue_s for p in sweeps),
                      "sweeps": len(sweeps)}
    return out


def predicted_phases(plan, blocks: int) -> dict | None:
    """The plan's seconds by phase for the job's `blocks` blocks, and each phase's per-layer terms (one block)."""
    if plan is None:
        return None
    return {"prefill": {"s": blocks * plan.prefill_s, "layer": plan.prefill_layer_s},
            "decode": {"s": blocks * plan.decode_s, "layer": plan.decode_layer_s}}


def worker_accelerate(args) -> dict:
    """One batch of `args.block` prompts through transformers' generate with Accelerate's offload, for 1 and for
    `args.peer_gen` new tokens (a prefill and a token, then the decode steps: `accelerate_job_s`)."""
    import torch

    model = accelerate_model(args)
    ids = torch.tensor(_prompts(args.block, args.prompt_len, model.config.vocab_size))

    @torch.inference_mode()
    def generate(gen, rows=ids):
        model.generate(rows, attention_mask=torch.ones_like(rows), max_new_tokens=gen, min_new_tokens=gen,
                       do_sample=False, pad_token_id=0)

    generate(1, ids[:1, :8])  # warm-up: the first call's one-time costs are no decode step's
    runs = _timed(generate, sorted({1, args.peer_gen}), [args.model, args.offload_dir / "accelerate"])
    return {"runs": {gen: run["s"] for gen, run in runs.items()}, "read_bytes": runs[max(runs)]["read_bytes"]}


def llama_cpp_best(args, cap: MemoryCap) -> dict:
    """llama-batched-bench at every --npl, each a batch of --peer-gen new tokens; the setting with the best
    job rate (the job's time from that batch's: `llama_cpp_job_s`)."""
    best = None
    for npl in (int(n) for n in args.npl.split(",")):
        drop_page_cache(args.gguf)
        cmd = [args.llama_cpp, "-m", str(args.gguf), "-c", str(npl * (args.prompt_len + args.peer_gen) + 16),
               "-b", "2048", "-ub", "512", "-npp", str(args.prompt_len), "-ntg", str(args.peer_gen), "-npl", str(npl),
               "-t", str(args.threads), "--output-format", "jsonl"]
        row, read = llama_jsonl_row(cap, cmd, args.timeout)
        job_s = llama_cpp_job_s(row, args.job, npl, args.peer_gen, args.gen_len)
        tps = args.job * args.gen_len / job_s
        print(f"  llama.cpp -npl {npl}: a batch's prefill {row['t_pp']:.1f} s ({row['t_pp'] / npl:.2f} s a prompt), "
              f"{args.peer_gen} decode steps {row['t_tg']:.1f} s ({row['t_tg'] / args.peer_gen:.2f} s a step); "
              f"the job{' projected' if args.peer_gen < args.gen_len or npl < args.job else ''} {job_s / 3600:.2f} h, "
              f"{tps:.2f} tok/s, {job_s / args.job:.2f} s a prompt", flush=True)
        if best is None or tps > best["tps"]:
            best = {"tps": tps, "npl": npl, "read_per_token": read["read_bytes"] / (npl * args.peer_gen)}
    return best


def _capped_worker(args, cap: MemoryCap, side: str, block: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", side, "--block", str(block), *_shared_flags(args)]
    out, _, _ = run_capped(cap, cmd, args.timeout)
    return json.loads(out.strip().splitlines()[-1])


def _shared_flags(args) -> list[str]:
    return ["--model", str(args.model), "--offload-dir", str(args.offload_dir), "--job", str(args.job),
            "--sample", str(args.sample), "--peer-gen", str(args.peer_gen),
            "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len), "--gpu-mem", str(args.gpu_mem),
            "--cpu-mem", str(args.cpu_mem), "--threads", str(args.threads)]


def _flexlamps_line(res: dict, job: int, gen_len: int) -> str:
    tokens = job * gen_len
    tps = tokens / res["s"]
    predicted = f", measured/predicted {tps / res['predicted_tps']:.2f}" if res["predicted_tps"] else ""
    return (f"  flexlamps  {res['block']:5d} sequences a sweep (experts {'streamed' if res['expert_group'] else 'staged'}): "
                 f"{tps:8.2f} tok/s, disk {res['read_bytes'] / tokens / 2**20:7.2f} MiB a token{predicted}; "
                 f"{res['s'] / job:.2f} s a prompt ({res['cpu_s'] / job:.2f} s of CPU, all threads); "
                 f"weights {res['weights_in_memory']:.0%} in memory, cache {res['cache_on_disk']:.0%} on disk, "
                 f"peak RSS {res['peak_rss'] / 2**20:.0f} MiB, {res['major_faults']} major page faults" + _phase_lines(res))


def _phase_lines(res: dict) -> str:
    """Each phase measured (its sweeps' wall, their wait on reads, their compute) against the plan's price."""
    lines = ""
    for phase, got in res.get("phases", {}).items():
        want = (res.get("predicted_phases") or {}).get(phase)
        priced = ""
        if want:
            terms = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in want["layer"].items())
            priced = f"; predicted {want['s']:.1f} s (ms a layer a sweep: {terms}), measured/predicted {want['s'] / got['s']:.2f}" \
                if got["s"] else ""
        lines += (f"\n    {phase}: {got['sweeps']} sweeps {got['s']:.1f} s (waiting on reads {got['io_wait_s']:.1f} s, "
                  f"compute {got['compute_s']:.1f} s, reads on the I/O thread {got['io_s']:.1f} s; the sweep thread's CPU "
                  f"{got.get('cpu_s', 0):.1f} s, waiting for a core {got.get('run_queue_s', 0):.1f} s){priced}")
    return lines


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
    sampled = args.sample < args.job or args.peer_gen < args.gen_len
    print(f"job {args.job} prompts x ({args.prompt_len} + {args.gen_len}); {cap.describe()}; flexlamps gpu "
          f"{args.gpu_mem / 2**20:.0f} MiB + cpu {args.cpu_mem / 2**20:.0f} MiB; "
          + (f"flexlamps a sample of {args.sample} prompts; " if args.sample < args.job else "")
          + (f"the peers' batches {args.peer_gen} new tokens; " if args.peer_gen < args.gen_len else "")
          + f"load {os.getloadavg()[0]:.1f}", flush=True)
    try:
        results = {}  # side -> the job's seconds
        blocks = [int(b) for b in args.blocks.split(",")] if args.blocks else [args.job]
        for block in blocks if "flexlamps" in args.sides else []:
            res = _capped_worker(args, cap, "flexlamps", block)
            print(_flexlamps_line(res, args.sample, args.gen_len), flush=True)
            job_s = res["s"] if args.sample >= args.job else flexlamps_job_s(res, args.job, args.sample)
            if job_s is not None:
                print(f"  flexlamps the job ({res['job_phases']['block'] if res.get('job_phases') else res['block']} "
                      f"a sweep){' projected' if sampled else ''}: {job_s / 3600:.2f} h, "
                      f"{args.job * args.gen_len / job_s:.2f} tok/s", flush=True)
                results["flexlamps"] = min(job_s, results.get("flexlamps", math.inf))
        if "accelerate" in args.sides:
            res = _capped_worker(args, cap, "accelerate", args.accelerate_batch)
            res["runs"] = {int(gen): s for gen, s in res["runs"].items()}  # JSON's keys are strings
            results["accelerate"] = accelerate_job_s(res["runs"], args.job, args.accelerate_batch, args.gen_len)
            print(f"  accelerate batch {args.accelerate_batch}: " + ", ".join(f"{g} new tokens {t:.1f} s"
                                                                          for g, t in res["runs"].items())
                  + f"; the job{' projected' if sampled else ''} {results['accelerate'] / 3600:.2f} h, "
                    f"{args.job * args.gen_len / results['accelerate']:.2f} tok/s", flush=True)
        if "llama.cpp" in args.sides and args.llama_cpp:
            best = llama_cpp_best(args, cap)
            results["llama.cpp"] = args.job * args.gen_len / best["tps"]
        for side in ("llama.cpp", "accelerate"):
            if side in results and "flexlamps" in results:
                print(f"  flexlamps / {side}{' (projected)' if sampled else ''}: "
                      f"{results[side] / results['flexlamps']:.2f}x")
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
    ap.add_argument("--sample", type=int, default=None,
                    help="flexlamps runs this many of the job's prompts and projects the job (default: all)")
    ap.add_argument("--peer-gen", type=int, default=None,
                    help="new tokens in the peers' batches, their decode scaled to --gen-len (default: --gen-len)")
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
    args.sample = min(args.sample or args.job, args.job)
    args.peer_gen = args.peer_gen or args.gen_len
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
