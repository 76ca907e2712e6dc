"""WikiText-2 perplexity of a model, uncompressed and with 4-bit weights and/or KV cache.

Sliding windows as in the HF perplexity recipe: windows of --window tokens every --stride
tokens; each window scores only the tokens not scored by the previous one. Compression runs
through the offload engine (all tiers on the gpu tier), so the cache really is stored 4-bit
and read back for attention. `int4` is the in-memory engine in bfloat16 with a GGUF's 4-bit
weights multiplied in place (the `--dtype auto` default for such files); `bf16` is dense bfloat16.

    python scripts/eval_perplexity.py --model smollm2-135m --tokens 32768 --window 1024 --stride 512

`--decode-rows N` scores the text as decode does instead: windows of --window tokens, N side by
side, fed one token a step, each step's logits scoring the next token. Decode's products have
few rows, so this is what measures the decode kernels (`int4`: the AVX-512 kernel, which rounds
x to integers per group; `FLEXLAMPS_NATIVE_KERNELS=0` runs torch's int4 kernel for comparison).

    python scripts/eval_perplexity.py --configs none,int4 --tokens 8192 --window 512 --decode-rows 8
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit

WIKITEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext2" / "wikitext-test.txt"
ALL_GPU = TierSplit(gpu=1, cpu=0, disk=0)


def perplexity(executor, ids: list[int], window: int, stride: int) -> float:
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        chunk = torch.tensor([ids[begin:end]])
        target_from = prev_end - begin  # tokens before this were scored by an earlier window
        cache = executor.new_cache(1, end - begin)
        logits = executor.forward_steps(cache, [Step(chunk, torch.arange(end - begin)[None], torch.tensor([0]))])[0]
        cache.release()
        logp = torch.log_softmax(logits[0, :-1], -1)
        targets = chunk[0, 1:]
        lp = logp.gather(-1, targets[:, None])[:, 0]
        start = max(target_from - 1, 0)
        nll -= float(lp[start:].sum())
        count += len(lp) - start
        prev_end = end
        if end == len(ids):
            break
    return math.exp(nll / count)


def decode_perplexity(executor, ids: list[int], window: int, rows: int) -> float:
    """Perplexity with every token scored by a decode step: `rows` windows of `window` tokens at
    a time, fed one token a step (teacher forcing)."""
    nll, count = 0.0, 0
    usable = len(ids) // window * window
    windows = torch.tensor(ids[:usable]).view(-1, window)
    for batch in windows.split(rows):
        n = batch.shape[0]
        cache = executor.new_cache(n, window)
        for t in range(window - 1):
            step = Step(batch[:, t:t + 1], torch.full((n, 1), t), torch.arange(n))
            logits = executor.forward_steps(cache, [step])[0].reshape(n, -1).float()
            nll -= float(torch.log_softmax(logits, -1).gather(-1, batch[:, t + 1:t + 2]).sum())
            count += n
        cache.release()
    return math.exp(nll / count)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--stride", type=int, default=512)
    ap.add_argument("--configs", default="none,weights,cache,both", help="comma-separated: none (fp32), "
                    "weights, cache, both (4-bit through the offload engine), bf16, int4 (in memory)")
    ap.add_argument("--wikitext", type=Path, default=WIKITEXT, help="WikiText-2 raw test file")
    ap.add_argument("--decode-rows", type=int, default=0,
                    help="score by decode steps, this many windows side by side (0: by prefill, with --stride)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    reader = open_checkpoint(args.model)
    text = args.wikitext.read_text(encoding="utf-8").replace("\r\n", "\n")
    ids = reader.tokenizer.encode(text)[: args.tokens]
    results = {}
    for name in args.configs.split(","):
        t = time.perf_counter()
        if name == "none":
            ex = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
        elif name in ("bf16", "int4"):
            weights = read_all(reader, torch.bfloat16, int4_in_place=name == "int4")
            ex = InMemoryExecutor(reader.config, weights, torch.bfloat16)
        else:
            policy = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=ALL_GPU, cache=ALL_GPU, activations=ALL_GPU,
                            compress_weight=name in ("weights", "both"), compress_cache=name in ("cache", "both"))
            ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config), gpu_mem=8 * 2**30, cpu_mem=2**30)
        results[name] = (decode_perplexity(ex, ids, args.window, args.decode_rows) if args.decode_rows
                          else perplexity(ex, ids, args.window, args.stride))
        base = results.get("none")
        delta = f" ({(results[name] / base - 1) * 100:+.2f}% vs uncompressed)" if base and name != "none" else ""
        print(f"{name:>8}: perplexity {results[name]:.4f}{delta}  [{time.perf_counter() - t:.0f} s]", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"tokens": len(ids), "window": args.window, "stride": args.stride,
                                              "decode_rows": args.decode_rows, "perplexity": results}, indent=2))


if __name__ == "__main__":
    main()
