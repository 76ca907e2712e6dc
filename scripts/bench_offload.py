"""flexlamps' offload engine vs HF Accelerate disk offload, same model, budget, prompts, in one run.

Budget: the `gpu` tier (here the CPU device, its budget enforced) gets --gpu-frac of the
model's weight bytes; the rest of the weights go to disk. Accelerate gets the same bytes as
`max_memory` for its resident weights and offloads the rest to its `offload_folder`.
flexlamps runs the policy the planner picks for that budget (`--policy auto`); Accelerate
runs the same prompts, batched at --accelerate-batch (default: all at once, its best case).

    python scripts/bench_offload.py --model smollm2 --prompts 32 --prompt-len 64 --gen-len 16
    python scripts/bench_offload.py --model tinyllama-random --dtype bfloat16 --prompts 64

Notes printed with the results: our disk reads drop the page cache (real disk reads);
Accelerate's memmaps are served from the page cache after the first pass whenever RAM can
hold them, which favours it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rope_theta=10000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)


def save_smollm2(folder: Path, dtype: torch.dtype) -> Path:
    """SmolLM2 as an HF safetensors folder (what Accelerate loads), from the built-in GGUF."""
    from safetensors.torch import save_file

    from flexlamps.models.checkpoint import read_all
    from flexlamps.models.registry import open_checkpoint
    from flexlamps.models.weight_specs import hf_name, weight_specs

    reader = open_checkpoint("smollm2-135m")
    weights = read_all(reader, dtype)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({hf_name(reader.config, s): weights[s.name].contiguous() for s in weight_specs(reader.config)},
              str(folder / "model.safetensors"))
    cfg = dict(reader.hf_config, architectures=["LlamaForCausalLM"], torch_dtype=str(dtype).removeprefix("torch."))
    (folder / "config.json").write_text(json.dumps(cfg))
    _copy_tokenizer(folder)
    return folder


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


def _copy_tokenizer(folder: Path) -> None:
    from flexlamps.models.registry import open_checkpoint

    tok = open_checkpoint("smollm2-135m").tokenizer
    tok.tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))


def prompts_for(tokenizer, n: int, length: int, vocab: int) -> list[list[int]]:
    text = ("The history of the printing press begins in the fifteenth century, when movable type changed "
            "how books were made and who could read them. ") * 200
    ids = [t % vocab for t in tokenizer.encode(text)]
    return [ids[i * 7: i * 7 + length] for i in range(n)]


def run_ours(folder, prompts, gen_len, dtype, gpu_mem, cpu_mem, offload_dir):
    from flexlamps import LLM, SamplingParams

    llm = LLM(str(folder), dtype=dtype, gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=str(offload_dir))
    llm.prepare(prompt_len=len(prompts[0]), gen_len=gen_len, num_sequences=len(prompts))
    llm.executor.record_profile = True
    params = SamplingParams(max_new_tokens=gen_len, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate_ids(prompts, [params] * len(prompts))
    wall = time.perf_counter() - t
    b = llm.executor.budgets
    info = dict(policy=llm.policy, predicted=llm.plan.tokens_per_s if llm.plan else None,
                gpu_peak=b["gpu"].peak_bytes, gpu_cap=b["gpu"].capacity_bytes,
                overlap=llm.executor.overlap_report())
    llm.close()
    return len(prompts) * gen_len / wall, [o.token_ids for o in outs], info


@torch.inference_mode()
def run_accelerate(folder, prompts, gen_len, dtype, cpu_mem, offload_dir, batch):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, dtype), device_map="auto", max_memory={"cpu": cpu_mem},
        offload_folder=str(offload_dir), offload_state_dict=True).eval()
    outs = []
    t = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i:i + batch])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_len,
                             min_new_tokens=gen_len, do_sample=False, pad_token_id=0)
        outs += out[:, ids.shape[1]:].tolist()
    wall = time.perf_counter() - t
    return len(prompts) * gen_len / wall, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "tinyllama-random"], default="smollm2")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--gpu-frac", type=float, default=0.25, help="gpu budget as a share of the weight bytes")
    ap.add_argument("--cpu-mem", default="64MiB", help="cpu tier budget (KV cache, activations, any weights "
                    "the planner puts there); Accelerate's max_memory gets the gpu and cpu budgets together")
    ap.add_argument("--accelerate-batch", type=int, default=None)
    ap.add_argument("--workdir", default=None, help="where models and offload folders go (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="flexlamps-bench-"))
    dtype = getattr(torch, args.dtype)
    folder = (save_smollm2(work / "smollm2-hf", dtype) if args.model == "smollm2"
              else save_random_tinyllama(work / "tinyllama-random", dtype))
    from flexlamps.models.registry import open_checkpoint
    from flexlamps.models.weight_specs import total_bytes

    reader = open_checkpoint(folder)
    wbytes = total_bytes(reader.config, dtype.itemsize if hasattr(dtype, "itemsize") else 4)
    gpu_mem = int(args.gpu_frac * wbytes)
    prompts = prompts_for(reader.tokenizer, args.prompts, args.prompt_len, reader.config.vocab_size)
    print(f"model {args.model} | weights {wbytes / 2**30:.2f} GiB {args.dtype} | gpu budget {gpu_mem / 2**30:.2f} GiB "
          f"({args.gpu_frac:.0%}) + cpu {args.cpu_mem}, rest on disk | {args.prompts} prompts x {args.prompt_len} tokens, {args.gen_len} new")
    shutil.rmtree(work / "ours-offload", ignore_errors=True)
    from placement import parse_bytes

    cpu_mem = int(parse_bytes(args.cpu_mem))
    ours_tps, ours_ids, info = run_ours(folder, prompts, args.gen_len, args.dtype, gpu_mem, cpu_mem,
                                        work / "ours-offload")
    p = info["policy"]
    print(f"flexlamps: policy block {p.gpu_batch_size}x{p.num_gpu_batches}, weights gpu {p.weights.gpu:.0%} "
          f"cpu {p.weights.cpu:.0%} disk {p.weights.disk:.0%}; predicted {info['predicted'] or 0:.2f} tok/s; "
          f"measured {ours_tps:.2f} tok/s; peak gpu tier {info['gpu_peak'] / 2**20:.0f} of {info['gpu_cap'] / 2**20:.0f} MiB")
    o = info["overlap"]
    print(f"overlap (steady state, {o['sweeps']} sweeps): per-layer wall {o['wall_s']:.2f} s vs max(I/O, compute) "
          f"{o['max_io_compute_s']:.2f} s = {o['ratio']:.2f}x (I/O {o['io_s']:.2f} s, compute {o['compute_s']:.2f} s)")
    shutil.rmtree(work / "acc-offload", ignore_errors=True)
    batch = args.accelerate_batch or args.prompts
    acc_tps, acc_ids = run_accelerate(folder, prompts, args.gen_len, args.dtype, gpu_mem + cpu_mem,
                                      work / "acc-offload", batch)
    same = sum(a == b for a, b in zip(ours_ids, acc_ids))
    print(f"accelerate disk offload (batch {batch}): {acc_tps:.2f} tok/s")
    print(f"ratio flexlamps / accelerate: {ours_tps / acc_tps:.2f}x | identical greedy outputs {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
