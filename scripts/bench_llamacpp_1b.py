"""flexlamps against llama.cpp on a checkpoint of random weights, CPU only: by default 1.1B
TinyLlama-shaped, or any shape of scripts/random_gguf.py (--shape).

The checkpoint (by default 22 layers, hidden 2048, FFN 5632, 32 heads, 4 kv heads, vocabulary
32000; weights N(0, 0.05) in fp16, tied embeddings) is written once as a GGUF with llama.cpp's own
`gguf` package and quantized by llama.cpp's `llama-quantize` to each of --quants; every side then
runs the same file. `--shape NAME[:field=value,...]` picks another (llama-3.2-1b: GQA 32/8, vocab
128256; qwen2.5-0.5b: hidden 896, 14/2 heads, q/k/v biases; smollm2-360m) with any size changed,
e.g. `--shape qwen2.5-0.5b:vocab=32002`: shapes no kernel was tuned to; the worker names every
matrix our kernels do not multiply on its codes (decode or prompt: torch's slower path runs it)
and every dense twin. llama.cpp runs `llama-batched-bench`; flexlamps runs `LLM.generate` in a
worker process of this script. Each side runs in its own process (its peak RSS from the kernel's
rusage), in turns, --repeats times; the fastest run counts. flexlamps first loads the file once,
untimed (a new file's weight cache is written then: that load's peak RSS is printed apart).
Printed per quantization: batch 1 decode (new tokens / s after the first), batch 1 and batch 32
total (new tokens / s of the whole call, prefill included), each batch's prompt rate (prompt tokens
/ s until the first new tokens; llama.cpp's own t_pp), peak RSS, and flexlamps' ratio to
llama.cpp for each, then the memory's limit on batch 1 decode (the file's bytes a step at the read
rate) and each side's share of it; first the CPU (model, flags) and the memory's bandwidth (a
reduction's read rate on --threads threads, and a copy's read + write rate).

`--isa avx2` caps flexlamps and torch at AVX2 ($FLEXLAMPS_CPU_VARIANT, $ATEN_CPU_CAPABILITY,
$ONEDNN_MAX_CPU_ISA) and runs a llama.cpp built without AVX-512 (scripts/llama_cpp_tools.py builds
it, or give --llama-cpp-tools), so an AVX-512 box measures the AVX2 path too. `--isa avx_vnni` is an
Intel desktop core's: flexlamps' avx_vnni variant, torch at AVX2, llama.cpp with AVX-VNNI (its
alderlake level; or give the AVX2 build in --llama-cpp-tools).

    python scripts/bench_llamacpp_1b.py [--quants Q4_K_M,Q4_0,Q8_0] [--isa native|avx2|avx_vnni] [--repeats 3] \\
        [--batches 1,32] [--llama-cpp-tools DIR] [--folder DIR] [--threads N] [--shape NAME[:field=value,...]]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from random_gguf import SHAPES, parse_shape, write_random_gguf  # noqa: E402
ISA_ENV = {"native": {}, "avx2": {"FLEXLAMPS_CPU_VARIANT": "avx2", "ATEN_CPU_CAPABILITY": "avx2",
                                   "ONEDNN_MAX_CPU_ISA": "AVX2"},
           # an Intel desktop core (12th gen on): AVX2 and AVX-VNNI, no AVX-512
           "avx_vnni": {"FLEXLAMPS_CPU_VARIANT": "avx_vnni", "ATEN_CPU_CAPABILITY": "avx2",
                        "ONEDNN_MAX_CPU_ISA": "AVX2"}}
CPU_FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi",
             "avx512_bf16", "amx_bf16")


def cpu_line() -> str:
    text = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return f"CPU: {model}, {os.cpu_count()} cpus; has {' '.join(f for f in CPU_FLAGS if f in flags) or '-'}"


def bandwidth_line(threads: int) -> tuple[str, float]:
    """The memory's read rate on `threads` threads (flexlamps' probe) and a stream-like copy's (read
    + write bytes / s), as a line; and the read rate (bytes / s)."""
    import numpy as np
    import torch

    from flexlamps.hardware.probes import measure_read_bandwidth

    src = np.ones(2**28 // 8)  # 256 MiB, far past the caches
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    torch.set_num_threads(threads)
    read = measure_read_bandwidth()
    return (f"memory: read {read / 1e9:.1f} GB/s ({threads}-thread reduction, median), "
            f"copy {2 * src.nbytes / best / 1e9:.1f} GB/s (read + write, best of 5)"), read


def make_checkpoint(folder: Path, shape_text: str) -> Path:
    """The fp16 GGUF of random weights in the shape `shape_text` names (written once)."""
    label, shape = parse_shape(shape_text)
    path = folder / f"{label}-random-f16.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        write_random_gguf(tmp, shape)
        tmp.rename(path)
    return path


def quantized(tools: Path, f16: Path, quant: str) -> Path:
    out = f16.with_name(f16.name.replace("-f16", f"-{quant}"))
    if not out.exists():
        subprocess.run([str(tools / "llama-quantize"), str(f16), str(out.with_suffix(".tmp")), quant], check=True,
                       capture_output=True)
        out.with_suffix(".tmp").rename(out)
    return out


# Runs argv[1:] and writes its peak RSS (KiB) last on stderr. A small process of its own: a child's
# ru_maxrss counts the image it was forked from, so a side forked from this script would count it.
_LAUNCHER = ("import resource, subprocess, sys\n"
             "code = subprocess.run(sys.argv[1:]).returncode\n"
             "sys.stderr.write(f'\\npeak-rss-kib {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
             "sys.exit(code)\n")


def run_measured(cmd: list[str], env: dict) -> tuple[str, int]:
    """(stdout, peak RSS in bytes of that process alone) of `cmd` run to its end."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *cmd], stdout=subprocess.PIPE, stderr=err,
                              text=True, env={**os.environ, **env})
        err.seek(0)
        lines = err.read().strip().splitlines()
    if proc.returncode or not lines or not lines[-1].startswith("peak-rss-kib "):
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {chr(10).join(lines[-10:])[-800:]}")
    return proc.stdout, int(lines[-1].split()[1]) * 1024


def llama_cpp(tools: Path, gguf: Path, batch: int, args) -> dict:
    """llama-batched-bench's run: total and decode seconds, new tokens, peak RSS."""
    cmd = [str(tools / "llama-batched-bench"), "-m", str(gguf), "-c", str(batch * (args.prompt_len + args.new_tokens) + 16),
           "-b", "2048", "-ub", "512", "-npp", str(args.prompt_len), "-ntg", str(args.new_tokens), "-npl", str(batch),
           "-t", str(args.threads), "--output-format", "jsonl"]
    out, rss = run_measured(cmd, {})
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(rows) != 1 or rows[0]["pl"] != batch:
        raise RuntimeError(f"unexpected llama-batched-bench output for batch {batch}: {out[-500:]}")
    return {"total_s": rows[0]["t"], "decode_s": rows[0]["t_tg"], "prefill_s": rows[0]["t_pp"],
            "decode_tokens": batch * args.new_tokens, "new_tokens": batch * args.new_tokens, "rss": rss}


def flexlamps(gguf: Path, batch: int, args, load_only: bool = False) -> dict:
    """This script's worker on the same file: the same figures as `llama_cpp` (`load_only`: the
    model loaded, its weight cache written where the file is new, and no more: its peak RSS)."""
    cmd = [sys.executable, __file__, "--worker", str(gguf), "--batch", str(batch), "--prompt-len", str(args.prompt_len),
           "--new-tokens", str(args.new_tokens), "--threads", str(args.threads)] + ["--load-only"] * load_only
    out, rss = run_measured(cmd, ISA_ENV[args.isa])
    return {**json.loads(out.strip().splitlines()[-1]), "rss": rss}


def worker(args) -> None:
    """One timed `generate` of --batch prompts after a warm-up, as JSON on stdout."""
    import torch

    from bench_generate import time_ours
    from bench_prompts import distinct_prompts
    from flexlamps import LLM

    torch.set_num_threads(args.threads)
    llm = LLM(args.worker, max_batch_size=args.batch)
    if args.load_only:
        return print("{}")
    time_ours(llm, distinct_prompts(llm.tokenizer, 1, args.prompt_len), 2)
    total, _, prefill = time_ours(llm, distinct_prompts(llm.tokenizer, args.batch, args.prompt_len), args.new_tokens)
    print(json.dumps({"total_s": total, "decode_s": total - prefill, "prefill_s": prefill,
                      "decode_tokens": args.batch * (args.new_tokens - 1),
                      "new_tokens": args.batch * args.new_tokens, "off_kernels": off_kernels(llm.executor)}))


def off_kernels(executor) -> list[str]:
    """The matrices an in-memory `executor` holds that our kernels do not multiply on their codes,
    in decode or in prompts (torch's path runs them: a dense GEMM, or a dequantization each call),
    each as "layer.name (N, K) form: phases"; a dense twin (a dequantized copy kept beside the codes,
    which the engine makes for every matrix when one of them is off the kernels) is named too. The
    embedding table's lookup is not a product."""
    import torch

    from flexlamps.models.blocks.coded_weights import Int4Twin, int8_prompts_take, native_kernel
    from quant.int4_weight import Int4Weight
    from quant.int8_weight import Int8Weight

    kernel = native_kernel()
    named = [(f"{i}.{n}", w) for i, layer in enumerate(executor.layer_weights) for n, w in layer.items()]
    off = []
    for name, w in named + [(n, w) for n, w in executor.global_weights.items() if n != "embed_tokens"]:
        twin = isinstance(w, Int4Twin)
        w = w.int4 if twin else w
        if isinstance(w, (Int4Weight, Int8Weight)):
            x = torch.empty(1, w.shape[1], dtype=w.dtype)
            phases = [p for p, runs in (("decode", kernel and kernel.runs(w, x)),
                                        ("prompt", kernel and kernel.runs_prompt(w, x) or int8_prompts_take(w, x)))
                      if not runs]
        else:
            phases = ["decode", "prompt"] if isinstance(w, torch.Tensor) and w.dim() == 2 else []
        if phases or twin:
            off.append(f"{name} {tuple(w.shape)} {type(w).__name__}{' with a dense twin' if twin else ''}: "
                       f"{', '.join(phases) or 'on the codes'}")
    return off


def best_of(sides: dict, repeats: int) -> dict:
    """Each side's fastest run (and its highest peak RSS), the sides run in turns."""
    best = {}
    for rep in range(repeats):
        for name in list(sides)[rep % len(sides):] + list(sides)[:rep % len(sides)]:
            run = sides[name]()
            old = best.get(name)
            if old is None or run["total_s"] < old["total_s"]:
                best[name] = {**run, "rss": max(run["rss"], old["rss"] if old else 0)}
            else:
                old["rss"] = max(old["rss"], run["rss"])
    return best


def compare(tools: Path, gguf: Path, args) -> None:
    """--batches (1 and 32) on one file: rates, peak RSS and flexlamps' ratios."""
    first = flexlamps(gguf, args.batches[0], args, load_only=True)  # a new file's weight cache written: not timed
    rows = {}
    for batch in args.batches:
        rows[batch] = best_of({"flexlamps": lambda: flexlamps(gguf, batch, args),
                               "llama.cpp": lambda: llama_cpp(tools, gguf, batch, args)}, args.repeats)
    figures = {}
    for batch, row in rows.items():
        if batch == 1:
            figures["batch 1 decode tok/s"] = {s: r["decode_tokens"] / r["decode_s"] for s, r in row.items()}
        figures[f"batch {batch} total tok/s"] = {s: r["new_tokens"] / r["total_s"] for s, r in row.items()}
        figures[f"batch {batch} prompt tok/s"] = {s: batch * args.prompt_len / r["prefill_s"] for s, r in row.items()}
    figures["peak RSS GB"] = {s: max(rows[b][s]["rss"] for b in rows) / 1e9 for s in ("flexlamps", "llama.cpp")}
    print(f"\n{gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB), load avg {os.getloadavg()[0]:.1f}")
    print(f"  flexlamps' first load: peak RSS {first['rss'] / 1e9:.2f} GB (its weight cache written where the file "
          "was new: once a file; the runs below read the cache)")
    off = rows[args.batches[0]]["flexlamps"]["off_kernels"]
    print(f"  matrices off our kernels: {len(off)}" + "".join(f"\n    {line}" for line in off[:12])
          + (f"\n    ... and {len(off) - 12} more" if len(off) > 12 else ""))
    for what, value in figures.items():
        print(f"  {what:<22} flexlamps {value['flexlamps']:8.2f}   llama.cpp {value['llama.cpp']:8.2f}   "
              f"ratio {value['flexlamps'] / value['llama.cpp']:.2f}x", flush=True)
    if "batch 1 decode tok/s" in figures:  # a decode step reads every weight once: the file's bytes
        limit = args.read_bytes_per_s / gguf.stat().st_size
        rates = figures["batch 1 decode tok/s"]
        print(f"  {'memory limit tok/s':<22} {limit:8.2f} (file bytes a step / read rate): flexlamps at "
              f"{rates['flexlamps'] / limit:.0%}, llama.cpp at {rates['llama.cpp'] / limit:.0%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quants", default="Q4_K_M,Q4_0,Q8_0", help="llama-quantize types, comma-separated")
    ap.add_argument("--shape", default="tinyllama-1.1b",
                    help=f"the checkpoint's shape: one of {', '.join(SHAPES)}, sizes changed by :field=value,... "
                         "(scripts/random_gguf.py; default %(default)s)")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default="native")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side, in turns; the fastest counts")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batches", default="1,32", help="batch sizes, comma-separated (1 adds the decode rate)")
    ap.add_argument("--folder", type=Path, default=Path.home() / ".cache" / "flexlamps-bench-1b",
                    help="where the checkpoint and its quantizations are written (default: %(default)s)")
    ap.add_argument("--llama-cpp-tools", type=Path, default=None,
                    help="a folder with llama-batched-bench and llama-quantize built for --isa (default: build them "
                         "with scripts/llama_cpp_tools.py)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--load-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    args.batches = [int(b) for b in args.batches.split(",")]
    try:
        parse_shape(args.shape)
    except ValueError as err:
        ap.error(str(err))
    from llama_cpp_tools import DEFAULT_DEST, ensure_tools

    tools = args.llama_cpp_tools or ensure_tools(DEFAULT_DEST, args.isa)
    if not (tools / "llama-batched-bench").is_file():
        ap.error(f"--llama-cpp-tools {tools}: no llama-batched-bench there (scripts/llama_cpp_tools.py builds it)")
    args.folder.mkdir(parents=True, exist_ok=True)
    print(cpu_line())
    line, args.read_bytes_per_s = bandwidth_line(args.threads)
    print(line)
    print(f"shape {args.shape}: {parse_shape(args.shape)[1]}")
    print(f"isa {args.isa} | threads {args.threads} | prompts {args.prompt_len} tokens, {args.new_tokens} new | "
          f"best of {args.repeats} | llama.cpp tools {tools}", flush=True)
    f16 = make_checkpoint(args.folder, args.shape)
    for quant in args.quants.split(","):
        compare(tools, quantized(tools, f16, quant.strip()), args)


if __name__ == "__main__":
    main()
