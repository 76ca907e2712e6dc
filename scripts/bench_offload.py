"""flexlamps' offload engine vs HF Accelerate disk offload, same model, budget, prompts, in one run.

Budget: the `gpu` tier (here the CPU device, its budget enforced) gets --gpu-frac of the
model's weight bytes; the rest of the weights go to disk. Accelerate gets the same bytes as
`max_memory` for its resident weights and offloads the rest to its `offload_folder`.
flexlamps runs the policy the planner picks for that budget (`--policy auto`); Accelerate
runs the same prompts, batched at --accelerate-batch (default: the largest batch whose cache
and activations fit the gpu budget beside its weights, as on a GPU; `all` is its best case here).

    python scripts/bench_offload.py --model smollm2 --prompts 32 --prompt-len 64 --gen-len 16
    python scripts/bench_offload.py --model tinyllama-random --dtype bfloat16 --prompts 64
    python scripts/bench_offload.py --model tinyllama-random --dtype bfloat16 --prompts 128 --cpu-mem 512MiB \
        --compress-weight --repeats 2 --workdir /tmp/bench-offload

`--compress-weight` keeps flexlamps' weights 4-bit on every tier (read 4-bit from disk, multiplied
in place by the int4 kernel for decode-sized calls, and on prefill chunks rounded to int8 for our
int8 GEMM where it runs, else dequantized for the dense GEMM); Accelerate has no such mode and runs uncompressed. `--repeats N` runs the two engines
alternately N times and compares the best of each (the machine may be shared).

The last line is the compute ceiling: the FLOPs both engines must do (every prompt token through
every layer, the head on each prompt's last position, gen_len - 1 decode steps) over this
machine's best GEMM rate (oneDNN's, or in bf16 our int8 GEMM's where it runs; the model's gate/up
over 1024 rows), measured after each
repeat: what an engine computing the layers with this GEMM reaches at most, however its weights
are stored or read, and so the largest ratio over Accelerate this machine allows.

Our disk reads drop the page cache (real disk reads). By default Accelerate's weight files
are dropped from the page cache after every layer too (--accelerate-page-cache keep serves
them from RAM after the first pass, which only a model smaller than RAM allows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench_prompts import distinct_prompts

TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rope_theta=10000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)


def save_smollm2(folder: Path, dtype: torch.dtype) -> Path:
    """SmolLM2 as an HF safetensors folder (what Accelerate loads), from the built-in GGUF."""
    from safetensors.torch import save_file

    from flexlamps.models.loading.checkpoint import read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.models.weight_specs import hf_name, weight_specs

    reader = open_checkpoint("smollm2-135m")
    weights = read_all(reader, dtype)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({hf_name(reader.config, s): weights[s.name].contiguous() for s in weight_specs(reader.config)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(llama_config_json(reader.config, dtype)))
    _copy_tokenizer(folder)
    return folder


def llama_config_json(cfg, dtype: torch.dtype) -> dict:
    """The config.json transformers loads a plain LLaMA (SmolLM2) from, written from its `ModelConfig`."""
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=cfg.hidden_size,
                intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position, rms_norm_eps=cfg.norm_eps,
                rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, tie_word_embeddings=cfg.tie_word_embeddings,
                bos_token_id=cfg.bos_token_id, eos_token_id=list(cfg.eos_token_ids) if len(cfg.eos_token_ids) > 1 else cfg.eos_token_ids[0],
                torch_dtype=str(dtype).removeprefix("torch."))


def save_random_tinyllama(folder: Path, dtype: torch.dtype) -> Path:
    """A random-weight LLaMA of TinyLlama-1.1B's shape, saved as safetensors."""
    import transformers

    if (folder / "config.json").exists():
        return folder
    cfg = transformers.LlamaConfig(**TINYLLAMA, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    _copy_tokenizer(folder)
    return folder


# a Mixtral-shaped MoE small enough for a 2-core box: top-2 of 32 experts in each of 4 layers
MIXTRAL_SMALL = dict(hidden_size=512, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=2, num_local_experts=32, num_experts_per_tok=2, vocab_size=32000,
                     max_position_embeddings=2048, tie_word_embeddings=False)


def save_random_mixtral(folder: Path, dtype: torch.dtype) -> Path:
    """A random-weight Mixtral-shaped MoE (MIXTRAL_SMALL), saved as safetensors."""
    import transformers

    if (folder / "config.json").exists():
        return folder
    cfg = transformers.MixtralConfig(**MIXTRAL_SMALL, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    _copy_tokenizer(folder)
    return folder


def _copy_tokenizer(folder: Path) -> None:
    from flexlamps.models.loading.registry import open_checkpoint

    tok = open_checkpoint("smollm2-135m").tokenizer
    tok.tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))


def run_ours(folder, prompts, gen_len, dtype, gpu_mem, cpu_mem, offload_dir, compress_weight=False):
    from flexlamps import LLM, SamplingParams

    llm = LLM(str(folder), dtype=dtype, gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=str(offload_dir),
              compress_weight=compress_weight or None)
    llm.prepare(prompt_len=len(prompts[0]), gen_len=gen_len, num_sequences=len(prompts))
    llm.executor.sweep.record_profile = True
    params = SamplingParams(max_new_tokens=gen_len, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate_ids(prompts, [params] * len(prompts))
    wall = time.perf_counter() - t
    b = llm.executor.budgets
    ex = llm.executor
    disk_bytes = sum(ex.weights.stored[name] for name, tier in ex.tiers.items() if tier == "disk")
    first = ex.sweep.profiles[0] if ex.sweep.profiles else None
    info = dict(policy=llm.policy, predicted=llm.plan.tokens_per_s if llm.plan else None,
                gpu_peak=b["gpu"].peak_bytes, gpu_cap=b["gpu"].capacity_bytes, disk_bytes=disk_bytes,
                overlap=ex.sweep.overlap_report(), sweeps=len(ex.sweep.profiles),
                experts=ex.expert_cache.stats() if ex.experts else None,
                prefill=dict(wall_s=first.sweep_s, io_s=sum(first.io_s), compute_s=sum(first.compute_s))
                if first is not None and first.prefill else None)
    llm.close()
    return len(prompts) * gen_len / wall, [o.token_ids for o in outs], info


def accelerate_fit(cfg, dtype_bytes: int, gpu_mem: int, cpu_mem: int, prompt_len: int, gen_len: int,
                   max_batch: int) -> tuple[int, int]:
    """(batch, max_memory bytes) for Accelerate under the same gpu budget as ours.

    On a GPU, Accelerate keeps the KV cache and activations on the device next to its resident
    weights, and copies each offloaded layer there before running it; on this CPU-only box
    nothing would stop it from growing them past the budget. So its batch is the largest power
    of two whose cache + activations + one streamed layer take at most half the gpu budget, and
    its resident weights get what is left (plus the cpu budget), as a user tuning it would do.
    """
    from flexlamps.models.weight_specs import total_bytes

    kv = cfg.kv_bytes_per_token(dtype_bytes) * (prompt_len + gen_len)
    # prefill peak per sequence: hidden in/out, q/k/v/o, the two FFN-wide buffers (SDPA keeps
    # no score matrix)
    act = dtype_bytes * prompt_len * (6 * cfg.hidden_size + 2 * cfg.intermediate_size)
    layer = total_bytes(cfg, dtype_bytes) // cfg.num_layers
    batch = 1
    while batch * 2 <= max_batch and layer + 2 * batch * (kv + act) <= gpu_mem // 2:
        batch *= 2
    return batch, max(1, gpu_mem - layer - batch * (kv + act)) + cpu_mem


class PageDropper:
    """Drops the page cache of the files Accelerate streams weights from after every layer, the
    way our engine reads them (posix_fadvise DONTNEED): a model larger than RAM is read from
    disk on every pass, not served from memory after the first."""

    def __init__(self, model, folders):
        self.paths = [p for f in folders for p in Path(f).rglob("*") if p.is_file()]
        for layer in model.model.layers:
            layer.register_forward_hook(lambda *_: self.drop())
        self.drop()

    def drop(self):
        for path in self.paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@torch.inference_mode()
def run_accelerate(folder, prompts, gen_len, dtype, max_memory, offload_dir, batch, drop_pages):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), device_map="auto", max_memory={"cpu": max_memory},
        offload_folder=str(offload_dir), offload_state_dict=True).eval()
    if drop_pages:  # weights on "disk" are read from the checkpoint's safetensors or the offload folder
        PageDropper(model, [folder, offload_dir] if Path(offload_dir).exists() else [folder])
    outs = []
    t = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i:i + batch])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_len,
                             min_new_tokens=gen_len, do_sample=False, pad_token_id=0)
        outs += out[:, ids.shape[1]:].tolist()
    wall = time.perf_counter() - t
    return len(prompts) * gen_len / wall, outs


def work_flops(config, num_prompts: int, prompt_len: int, gen_len: int) -> tuple[float, float]:
    """(prefill, decode) FLOPs both engines must do: every prompt token through every layer's
    matrices and attention, the head on each prompt's last position only, then gen_len - 1
    decode steps (the planner's own per-token counts, `placement.ModelSpec`)."""
    from flexlamps.models.description import model_spec

    m = model_spec(config)  # every family the engine runs
    per_token = m.num_layers * m.matmul_flops_per_token_per_layer()
    prompt_attn = m.num_layers * sum(m.attention_flops_per_query(t + 1) for t in range(prompt_len))
    prefill = num_prompts * (prompt_len * per_token + prompt_attn + m.head_flops_per_token())
    decode = num_prompts * sum(per_token + m.head_flops_per_token()
                               + m.num_layers * m.attention_flops_per_query(prompt_len + t + 1)
                               for t in range(gen_len - 1))
    return prefill, decode


def gemm_peak(config, rows: int, dtype: torch.dtype, repeats: int = 7) -> float:
    """Best FLOP/s of this machine's GEMM (at torch's thread count) on the model's largest stacked
    matrix (LLaMA's gate/up) over `rows` rows: the faster of oneDNN's dense GEMM (prepacked) and,
    in bf16 where it runs, our int8 GEMM (`flexlamps.kernels.int8_gemm`, which 4-bit prompts use): the rate
    no engine computing these layers exceeds by much."""
    from flexlamps.models.blocks.linear import int8_kernel, linear, pack

    hidden, ffn = config.hidden_size, config.intermediate_size
    x = torch.randn(rows, hidden, dtype=dtype)
    w = torch.randn(2 * ffn, hidden) * 0.02
    products = [lambda dense=pack(w.to(dtype)): linear(x, dense)]
    kernel = int8_kernel() if dtype == torch.bfloat16 else None
    if kernel is not None:
        products.append(lambda codes=kernel.pack(w.bfloat16()): kernel.matmul(x, codes))
    best = float("inf")
    for _ in range(repeats):
        for product in products:
            t = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - t)
    return 2 * rows * hidden * 2 * ffn / best


def _print_ceiling(config, args, peak: float, acc_tps: float) -> None:
    prefill, decode = work_flops(config, args.prompts, args.prompt_len, args.gen_len)
    ceiling = args.prompts * args.gen_len / ((prefill + decode) / peak)
    print(f"compute ceiling: {(prefill + decode) / 1e12:.2f} TFLOP of work (prefill {prefill / 1e12:.2f}, decode "
          f"{decode / 1e12:.2f}) at this machine's best GEMM rate {peak / 1e9:.0f} GFLOP/s "
          f"({torch.get_num_threads()} threads, best of the repeats) = {ceiling:.2f} tok/s at most, "
          f"{ceiling / acc_tps:.2f}x accelerate's best")


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "tinyllama-random", "mixtral-random"], default="smollm2")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--gpu-frac", type=float, default=0.25, help="gpu budget as a share of the weight bytes")
    ap.add_argument("--cpu-mem", default="64MiB", help="cpu tier budget (KV cache, activations, any weights "
                    "the planner puts there); Accelerate's max_memory gets the gpu and cpu budgets together")
    ap.add_argument("--accelerate-batch", default="fit",
                    help="Accelerate's batch: 'fit' (largest whose KV cache and activations fit the gpu "
                    "budget beside its weights, as on a GPU), 'all' (every prompt at once: its best case on "
                    "a CPU, where nothing bounds it), or a number")
    ap.add_argument("--accelerate-prompts", type=int, default=None,
                    help="how many of the prompts Accelerate runs (default: one batch)")
    ap.add_argument("--accelerate-page-cache", choices=["drop", "keep"], default="drop",
                    help="drop: Accelerate's weight files leave the page cache after each layer, as ours "
                    "do (a model bigger than RAM); keep: served from RAM after the first pass")
    ap.add_argument("--workdir", default=None, help="where models and offload folders go (default: a temp dir)")
    ap.add_argument("--compress-weight", action="store_true",
                    help="flexlamps keeps its weights 4-bit on every tier, computed in place")
    ap.add_argument("--repeats", type=int, default=1, help="alternate the two engines this many times; "
                    "best of each")
    return ap.parse_args()


def main():
    args = _parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="flexlamps-bench-"))
    dtype = getattr(torch, args.dtype)
    save = {"smollm2": save_smollm2, "tinyllama-random": save_random_tinyllama, "mixtral-random": save_random_mixtral}
    folder = save[args.model](work / args.model, dtype)
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.models.weight_specs import total_bytes

    reader = open_checkpoint(folder)
    wbytes = total_bytes(reader.config, dtype.itemsize if hasattr(dtype, "itemsize") else 4)
    gpu_mem = int(args.gpu_frac * wbytes)
    prompts = distinct_prompts(reader.tokenizer, args.prompts, args.prompt_len, reader.config.vocab_size)
    print(f"model {args.model} | weights {wbytes / 2**30:.2f} GiB {args.dtype} | gpu budget {gpu_mem / 2**30:.2f} GiB "
          f"({args.gpu_frac:.0%}) + cpu {args.cpu_mem}, rest on disk | {args.prompts} prompts x {args.prompt_len} tokens, {args.gen_len} new")
    shutil.rmtree(work / "ours-offload", ignore_errors=True)
    shutil.rmtree(work / "acc-offload", ignore_errors=True)
    from placement import parse_bytes

    cpu_mem = int(parse_bytes(args.cpu_mem))
    if args.accelerate_batch == "fit":
        batch, max_memory = accelerate_fit(reader.config, dtype.itemsize, gpu_mem, cpu_mem, args.prompt_len,
                                           args.gen_len, args.prompts)
    else:
        batch = args.prompts if args.accelerate_batch == "all" else int(args.accelerate_batch)
        max_memory = gpu_mem + cpu_mem
    # its batches are alike, so by default it runs one of them (tokens/s is per batch anyway)
    acc_prompts = prompts[:args.accelerate_prompts or batch]
    ours_runs, acc_runs, peaks = [], [], []
    llama = reader.config.arch == "decoder"  # the ceiling's GEMM probe takes its gate/up
    for repeat in range(args.repeats):
        ours_runs.append(run_ours(folder, prompts, args.gen_len, args.dtype, gpu_mem, cpu_mem, work / "ours-offload",
                                  args.compress_weight))
        _print_ours(ours_runs[-1], repeat)
        acc_runs.append(run_accelerate(folder, acc_prompts, args.gen_len, args.dtype, max_memory,
                                       work / "acc-offload", batch, args.accelerate_page_cache == "drop"))
        print(f"[{repeat + 1}] accelerate disk offload (batch {batch}, {len(acc_prompts)} of the {len(prompts)} prompts, "
              f"resident weights up to {max_memory / 2**20:.0f} MiB, page cache {args.accelerate_page_cache}): "
              f"{acc_runs[-1][0]:.2f} tok/s", flush=True)
        peaks += [gemm_peak(reader.config, 1024, dtype)] if llama else []
    ours_tps, ours_ids, _ = max(ours_runs, key=lambda r: r[0])
    acc_tps, acc_ids = max(acc_runs, key=lambda r: r[0])
    same = sum(a == b for a, b in zip(ours_ids, acc_ids))
    print(f"best of {args.repeats}: flexlamps {ours_tps:.2f} tok/s, accelerate {acc_tps:.2f} tok/s "
          f"(each run: {', '.join(f'{r[0]:.2f}' for r in ours_runs)} vs {', '.join(f'{r[0]:.2f}' for r in acc_runs)})")
    print(f"ratio flexlamps / accelerate: {ours_tps / acc_tps:.2f}x | identical greedy outputs {same}/{len(acc_ids)}"
          f"{' (flexlamps 4-bit, accelerate uncompressed)' if args.compress_weight else ''}")
    if peaks:
        _print_ceiling(reader.config, args, max(peaks), acc_tps)


def _print_ours(run, repeat: int) -> None:
    tps, _, info = run
    if info["experts"]:
        e = info["experts"]
        print(f"    routed experts read off the cpu/disk tiers: {e['misses']}, served by the hot set ({e['order']}): "
              f"{e['hits']} (hit rate {e['hit_rate']:.2f}; {e['kept']} kept)")
    p = info["policy"]
    print(f"[{repeat + 1}] flexlamps: policy block {p.gpu_batch_size}x{p.num_gpu_batches}, weights gpu {p.weights.gpu:.0%} "
          f"cpu {p.weights.cpu:.0%} disk {p.weights.disk:.0%} ({info['disk_bytes'] / 2**20:.0f} MiB on disk), "
          f"compress weight {p.compress_weight}; predicted {info['predicted'] or 0:.2f} tok/s; measured {tps:.2f} tok/s; "
          f"peak gpu tier {info['gpu_peak'] / 2**20:.0f} of {info['gpu_cap'] / 2**20:.0f} MiB")
    o = info["overlap"]
    bound = "compute" if o["compute_s"] >= o["io_s"] else "I/O"
    print(f"    decode (steady state, {o['sweeps']} sweeps): per-layer wall {o['wall_s']:.2f} s vs max(I/O, compute) "
          f"{o['max_io_compute_s']:.2f} s = {o['ratio']:.2f}x (I/O {o['io_s']:.2f} s, compute {o['compute_s']:.2f} s: "
          f"{bound}-bound)")
    if info["prefill"]:
        f = info["prefill"]
        print(f"    prefill sweep: {f['wall_s']:.2f} s (layers' I/O {f['io_s']:.2f} s, compute {f['compute_s']:.2f} s)",
              flush=True)


if __name__ == "__main__":
    main()
