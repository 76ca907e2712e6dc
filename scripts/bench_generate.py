"""flexlamps vs transformers `generate()` on SmolLM2-135M, CPU, greedy, in one process.

Same weights (transformers' model is built from the tensors flexlamps loaded from the GGUF),
same prompts (exactly --prompt-len tokens, so neither side pads), same number of new tokens.
Prints tokens/s of each (the faster of --repeats runs, alternating which side goes first, as
the shared cores are noisy), the ratio, and the fraction of the machine's limit reached: the
larger of "every decode step reads all weights at memcpy bandwidth" (batch 1) and "every
prompt and generated token's matmuls at the measured GEMM peak" (big batches).

    python scripts/bench_generate.py [--batch-sizes 1,8,32] [--prompt-len 128] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from flexlamps import LLM, SamplingParams
from flexlamps.models.linear import linear, pack, unpack
from flexlamps.models.weight_specs import hf_name, weight_specs

WIKITEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext2" / "wikitext-test.txt"


def make_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    text = WIKITEXT.read_text().replace("\r\n", "\n") if WIKITEXT.exists() else (
        "The history of the printing press begins in the fifteenth century, when movable type changed "
        "how books were made and who could read them. " * 400)
    ids = tokenizer.encode(text[:400_000])
    return [ids[i * length * 3: i * length * 3 + length] for i in range(n)]


def transformers_model(llm: LLM):
    import transformers

    c = llm.config
    cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position, rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    state = {hf_name(c, s): unpack(llm.executor.global_weights[s.name] if s.layer is None
                                   else llm.executor.layer_weights[s.layer][s.local_name]) for s in weight_specs(c)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    model.tie_weights()
    return model


def time_ours(llm, prompts, new_tokens) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate_ids(prompts, [params] * len(prompts))
    return time.perf_counter() - t, [o.token_ids for o in outs]


@torch.inference_mode()
def time_theirs(model, prompts, new_tokens) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts)
    t = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=2)
    return time.perf_counter() - t, out[:, ids.shape[1]:].tolist()


def memory_bandwidth() -> float:
    a = torch.empty(64 * 2**20, dtype=torch.uint8)
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        best = max(best, 2 * a.numel() / (time.perf_counter() - t))  # read + write
    return best


def gemm_flops(hidden: int, intermediate: int) -> float:
    """fp32 FLOP/s of a prefill-sized GEMM of this model's shape, through the engine's linear."""
    x, w = torch.randn(4096, hidden), pack(torch.randn(intermediate, hidden))
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        linear(x, w)
        best = max(best, 2.0 * x.shape[0] * hidden * intermediate / (time.perf_counter() - t))
    return best


def roofline_seconds(cfg, batch: int, prompt_len: int, new_tokens: int, bw: float, flops: float) -> float:
    """The least time the whole call can take: each decode step reads every weight once, and
    every token's matmuls run at the GEMM peak; the larger of the two bounds."""
    decoder = sum(s.numel for s in weight_specs(cfg) if s.layer is not None)
    head = cfg.vocab_size * cfg.hidden_size
    weight_bytes = (decoder + head) * 4
    work = 2.0 * batch * (decoder * (prompt_len + new_tokens) + head * new_tokens)
    return max(new_tokens * weight_bytes / bw, work / flops)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each side per batch size, alternating which goes first; the fastest counts")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM("smollm2-135m", dtype="float32", max_batch_size=max(map(int, args.batch_sizes.split(","))))
    model = transformers_model(llm)
    cfg = llm.config
    weight_bytes = sum(s.numel for s in weight_specs(cfg)) * 4
    bw, flops = memory_bandwidth(), gemm_flops(cfg.hidden_size, cfg.intermediate_size)
    print(f"threads {torch.get_num_threads()} | weights {weight_bytes / 2**20:.0f} MiB fp32 | "
          f"memcpy bandwidth {bw / 1e9:.1f} GB/s -> batch-1 decode limit {bw / weight_bytes:.1f} tok/s | "
          f"GEMM peak {flops / 1e9:.0f} GFLOP/s")
    print(f"{'batch':>5} {'flexlamps tok/s':>16} {'transformers tok/s':>19} {'ratio':>6} {'same tokens':>12} {'of limit':>9}")
    warm = make_prompts(llm.tokenizer, 2, args.prompt_len)
    time_ours(llm, warm[:1], 4)
    time_theirs(model, warm[:1], 4)
    for bs in map(int, args.batch_sizes.split(",")):
        prompts = make_prompts(llm.tokenizer, bs, args.prompt_len)
        ours_s = theirs_s = float("inf")
        for rep in range(args.repeats):
            sides = ["ours", "theirs"] if rep % 2 == 0 else ["theirs", "ours"]
            for side in sides:
                if side == "ours":
                    seconds, ours_ids = time_ours(llm, prompts, args.new_tokens)
                    ours_s = min(ours_s, seconds)
                else:
                    seconds, theirs_ids = time_theirs(model, prompts, args.new_tokens)
                    theirs_s = min(theirs_s, seconds)
        n = bs * args.new_tokens
        agree = sum(a == b for a, b in zip(ours_ids, theirs_ids))
        limit_s = roofline_seconds(cfg, bs, args.prompt_len, args.new_tokens, bw, flops)
        print(f"{bs:>5} {n / ours_s:>16.1f} {n / theirs_s:>19.1f} {theirs_s / ours_s:>6.2f} "
              f"{agree:>5}/{bs:<6} {limit_s / ours_s:>8.0%}")


if __name__ == "__main__":
    main()
