"""Q8_0 computed in place (`quant.int8_weight.Int8Weight`) vs the resident bf16 copy, per call and
per model: time, memory, logits against the fp32 reference, greedy agreement.

1. The SmolLM2 tied head (49152 x 576, Q8_0 in the built-in GGUF) at each row count: the dense
   bf16 GEMM on a prepacked copy, the fused call on the int8 codes, and a per-call
   dequantization (what a plain weight does from `INT8_DENSE_FROM_ROWS` rows), best of --repeats.
2. The built-in SmolLM2 GGUF as it is (Q4_1 layers, Q8_0 tied head), in bf16 with dense twins (the
   default): the head kept int8 (the default) or as a bf16 copy; decode step and agreement with fp32.
3. A model whose matrices are all Q8_0: SmolLM2's own weights (dequantized from the built-in
   GGUF) written as a Q8_0 GGUF, then run by the in-memory engine in bf16 with the bf16 copy,
   with int8 twins (the default when memory allows) and with plain int8; decode-step time at
   batch 1 and 32, prefill logits and --new-tokens greedy tokens against fp32 on WikiText-2
   prompts (generated text without the shared data).

    python scripts/bench_q8.py [--rows 1,2,4,32] [--repeats 5] [--new-tokens 16] [--prompts 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_prompts import distinct_prompts
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.loading.checkpoint import GGUFReader, read_all
from flexlamps.models.blocks.linear import Int4Twin, linear, pack
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from quant.int8_weight import Int8Weight

MiB = 2**20


def best_ms(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def head_table(rows_list: list[int], repeats: int) -> None:
    reader = open_checkpoint("smollm2-135m")
    spec = next(s for s in weight_specs(reader.config) if s.name == "embed_tokens")
    int8 = reader.read_int8(spec, torch.bfloat16)
    dense = pack(reader.read(spec, torch.bfloat16))
    scratch = torch.empty(int8.shape, dtype=torch.bfloat16)
    copy_mib = int8.shape[0] * int8.shape[1] * 2 / MiB
    print(f"tied head {int8.shape[0]}x{int8.shape[1]} Q8_0 | resident: bf16 copy {copy_mib:.1f}"
          f" MiB, int8 {int8.nbytes / MiB:.1f} MiB")
    print("| rows | bf16 copy ms | int8 fused ms | int8 dequantized per call ms | fused / copy |")
    print("|---|---|---|---|---|")
    for rows in rows_list:
        x = torch.randn(rows, int8.shape[1], dtype=torch.bfloat16)
        copy = best_ms(lambda: linear(x, dense), repeats)
        fused = best_ms(lambda: int8.matmul(x), repeats)
        deq = best_ms(lambda: linear(x, int8.dequantize(out=scratch)), max(2, repeats // 2))
        print(f"| {rows} | {copy:.2f} | {fused:.2f} | {deq:.2f} | {fused / copy:.2f}x |")


def write_q8_smollm2(path: Path) -> Path:
    """SmolLM2's weights (fp32 from the built-in GGUF) as a GGUF whose matrices are all Q8_0."""
    import gguf
    from gguf.quants import quantize

    src = open_checkpoint("smollm2-135m")
    cfg = src.config
    w = gguf.GGUFWriter(str(path), "llama")
    for key in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "vocab_size", "context_length"):
        if f"llama.{key}" in src.fields:
            w.add_uint32(f"llama.{key}", int(src.fields[f"llama.{key}"]))
    w.add_float32("llama.attention.layer_norm_rms_epsilon", float(cfg.norm_eps))
    w.add_float32("llama.rope.freq_base", float(cfg.rope_theta))
    w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])  # ids only: the prompts come tokenized
    q8 = gguf.GGMLQuantizationType.Q8_0
    names = {"embed_tokens": "token_embd.weight", "norm": "output_norm.weight"}
    local = {"attn_norm": "attn_norm", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
             "o_proj": "attn_output", "mlp_norm": "ffn_norm", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
             "down_proj": "ffn_down"}
    for spec in weight_specs(cfg):
        t = src.read(spec, torch.float32)
        heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads}.get(spec.local_name)
        if heads:  # back into llama.cpp's interleaved q/k rows (the reader undoes it)
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, t.shape[1]).transpose(1, 2).reshape(t.shape)
        name = names[spec.name] if spec.layer is None else f"blk.{spec.layer}.{local[spec.local_name]}.weight"
        data = t.numpy()
        if t.dim() == 2:
            w.add_tensor(name, quantize(data, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def engines(reader) -> dict[str, InMemoryExecutor]:
    cfg, bf16 = reader.config, torch.bfloat16
    int8 = read_all(reader, bf16, int4_in_place=True)
    return {"fp32 reference": InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32),
            "bf16 copy": InMemoryExecutor(cfg, read_all(reader, bf16), bf16),
            "int8 twins (default)": InMemoryExecutor(cfg, int8, bf16, dense_twins=True),
            "int8 plain (lean)": InMemoryExecutor(cfg, int8, bf16, dense_twins=False)}


def resident_mib(ex: InMemoryExecutor) -> float:
    """Weight bytes the executor holds now (a twin's dense copy only once made; a tied head's
    dense copy is the embedding table, counted once)."""
    table = ex.global_weights.get("embed_tokens")
    total = 0
    for w in [*ex.global_weights.values(), *(t for layer in ex.layer_weights for t in layer.values())]:
        if isinstance(w, Int4Twin):
            held = w._dense if w._dense is not None else w._plain
            extra = held is not None and not callable(held) and held is not table
            total += w.int4.nbytes + (w.shape[0] * w.shape[1] * w.dtype.itemsize if extra else 0)
        elif isinstance(w, Int8Weight):
            total += w.nbytes
        else:
            total += w.numel() * w.element_size()
    return total / MiB


def generate(ex: InMemoryExecutor, prompts: list[list[int]], new_tokens: int):
    """(last-position prefill logits (n, V) fp32, greedy tokens (n, new_tokens), decode ms per step)."""
    n, length = len(prompts), len(prompts[0])
    cache = ex.new_cache(n, length + new_tokens + 1)
    ids = torch.tensor(prompts)
    logits = ex.forward_steps(cache, [Step(ids, torch.arange(length).expand(n, -1), torch.arange(n),
                                           torch.full((n,), length - 1))])[0].reshape(n, -1)
    tokens = [logits.argmax(-1)]
    t = time.perf_counter()
    for i in range(new_tokens - 1):
        out = ex.forward_steps(cache, [Step(tokens[-1][:, None], torch.full((n, 1), length + i), torch.arange(n))])[0]
        tokens.append(out[:, -1].argmax(-1))
    step_ms = (time.perf_counter() - t) / max(1, new_tokens - 1) * 1e3
    return logits.float(), torch.stack(tokens, 1), step_ms


def builtin_engines(reader) -> dict[str, InMemoryExecutor]:
    cfg, bf16 = reader.config, torch.bfloat16
    weights = read_all(reader, bf16, int4_in_place=True)
    copy_head = {k: v for k, v in weights.items() if k != "lm_head"}  # the head: the packed table
    return {"fp32 reference": InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32),
            "head as bf16 copy": InMemoryExecutor(cfg, copy_head, bf16, dense_twins=True),
            "head int8 (default)": InMemoryExecutor(cfg, weights, bf16, dense_twins=True)}


def model_table(args, title: str, reader, exes: dict[str, InMemoryExecutor]) -> None:
    tokenizer = open_checkpoint("smollm2-135m").tokenizer
    prompts = distinct_prompts(tokenizer, max(32, args.prompts), args.prompt_len)
    step = {name: {} for name in exes}
    results = {}
    for _ in range(args.repeats):  # alternating; best of each
        for name, ex in exes.items():
            for batch in (1, 32):
                ms = generate(ex, prompts[:batch], 9)[2]
                step[name][batch] = min(step[name].get(batch, float("inf")), ms)
    for name, ex in exes.items():
        results[name] = generate(ex, prompts[:args.prompts], args.new_tokens)
    ref_logits, ref_tokens, _ = results["fp32 reference"]
    print(f"\n{title}, bf16 compute, {args.prompts} prompts x {args.prompt_len} tokens, "
          f"{args.new_tokens} greedy tokens")
    print("| engine | weights MiB | decode ms/step b=1 | b=32 | prefill logits max diff / max | "
          "greedy tokens = fp32 | identical outputs |")
    print("|---|---|---|---|---|---|---|")
    for name, ex in exes.items():
        logits, tokens, _ = results[name]
        diff = (logits - ref_logits).abs().max().item() / ref_logits.abs().max().item()
        same = (tokens == ref_tokens).sum().item()
        whole = (tokens == ref_tokens).all(1).sum().item()
        print(f"| {name} | {resident_mib(ex):.0f} | {step[name][1]:.1f} | {step[name][32]:.1f} | {diff:.2e} | "
              f"{same}/{tokens.numel()} | {whole}/{len(tokens)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,32", help="row counts of the head table")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-model", action="store_true", help="the head table only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head_table([int(r) for r in args.rows.split(",")], args.repeats)
    if args.skip_model:
        return
    builtin = open_checkpoint("smollm2-135m")
    model_table(args, "built-in SmolLM2 GGUF (Q4_1 layers, Q8_0 tied head)", builtin, builtin_engines(builtin))
    work = Path(tempfile.mkdtemp(prefix="flexlamps-q8-"))
    reader = GGUFReader(write_q8_smollm2(work / "smollm2-q8_0.gguf"), work)
    model_table(args, f"all-Q8_0 SmolLM2 ({work})", reader, engines(reader))


if __name__ == "__main__":
    main()
