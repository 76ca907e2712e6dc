"""Offloading the latent cache under a fixed gpu budget: a tiny random DeepSeek-V3.2-shaped
model (MLA, lightning indexer, MoE) built with transformers, weights on the gpu tier, the
cache either all on the gpu tier or in ESS's layout (records on the cpu tier, indexer keys and
one step's top-k pool per layer on the gpu tier). Prints each layout's largest batch within
the same gpu budget and its measured decode tokens/s (timed from the step where every prompt
has its first token), and the ratios; alternating runs, best of --repeats.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_latent.py [--prompt-len 960 --gen-len 32]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' tiny tokenizer, as bench_quant does

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from offload.budget import BudgetExceededError
from placement import Policy, TierSplit

MODEL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32,
             qk_rope_head_dim=32, v_head_dim=32, index_topk=64, index_head_dim=64, index_n_heads=8,
             n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=128,
             n_group=2, topk_group=1, first_k_dense_replace=1, max_position_embeddings=4096)


def build_model(folder: Path) -> Path:
    import transformers

    from tests.conftest import save_tiny_tokenizer  # noqa: E402

    vocab = save_tiny_tokenizer(folder)
    torch.manual_seed(0)
    cfg = transformers.DeepseekV32Config(vocab_size=vocab, bos_token_id=0, eos_token_id=1, **MODEL)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


def policy(cache_gpu: float, batch: int) -> Policy:
    return Policy(gpu_batch_size=batch, num_gpu_batches=1, weights=TierSplit(gpu=1, cpu=0, disk=0),
                  cache=TierSplit(gpu=cache_gpu, cpu=1 - cache_gpu, disk=0),
                  activations=TierSplit(gpu=1, cpu=0, disk=0))


def largest_batch(reader, cache_gpu: float, gpu_mem: int, capacity: int, reserve: int) -> int:
    """The most sequences whose cache fits beside the weights, leaving `reserve` bytes of work space."""
    ex = OffloadExecutor(reader, policy(cache_gpu, 1), model_spec=model_spec(reader.config),
                         gpu_mem=gpu_mem - reserve, cpu_mem=1 << 34)
    batch = 1
    while True:
        try:
            ex.new_cache(batch + 1, capacity).release()
        except BudgetExceededError:
            ex.close()
            return batch
        batch += 1


def decode_tokens_per_s(reader, cache_gpu, batch, gpu_mem, prompts, gen_len) -> float:
    """Decode tokens/s once every prompt has its first token (all prefills done)."""
    ex = OffloadExecutor(reader, policy(cache_gpu, batch), model_spec=model_spec(reader.config),
                         gpu_mem=gpu_mem, cpu_mem=1 << 34)
    marks = []  # (time, tokens so far)

    def on_tokens(n: int) -> None:
        marks.append((time.perf_counter(), (marks[-1][1] if marks else 0) + n))

    params = [SamplingParams(max_new_tokens=gen_len, ignore_eos=True)] * len(prompts)
    # prompts prefill one at a time (their attention scores are the largest work space);
    # decode steps run merged over the whole batch
    generate(ex, reader.tokenizer, prompts, params, max_batch=batch, micro_batch=1, reuse_prefix=False,
             on_tokens=on_tokens)
    ex.close()
    start = next(i for i, (_, n) in enumerate(marks) if n >= len(prompts))
    return (marks[-1][1] - marks[start][1]) / (marks[-1][0] - marks[start][0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=960)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--dense-batch", type=int, default=4, help="sequences the all-on-gpu cache may hold")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        reader = open_checkpoint(build_model(Path(tmp)))
        cfg = reader.config
        capacity = args.prompt_len + args.gen_len
        per_seq = cfg.num_layers * capacity * (cfg.mla.latent_width + cfg.mla.index_head_dim) * 4
        weights = sum(s.numel for s in weight_specs(cfg)) * 4
        reserve = 64 << 20  # work space: activations, attention scores, a layer's staged records
        gpu_mem = weights + reserve + args.dense_batch * per_seq + 4096
        batches = {mode: largest_batch(reader, gpu, gpu_mem, capacity, reserve)
                   for mode, gpu in (("gpu cache", 1.0), ("offloaded", 0.0))}
        print(f"gpu budget {gpu_mem / 2**20:.1f} MiB (weights {weights / 2**20:.1f} MiB); context {capacity}; "
              f"largest batch: all on gpu {batches['gpu cache']}, offloaded {batches['offloaded']} "
              f"({batches['offloaded'] / batches['gpu cache']:.2f}x)")
        gen = torch.Generator().manual_seed(0)
        best = {}
        for _ in range(args.repeats):  # alternate the two layouts, keep each one's best
            for mode, gpu in (("gpu cache", 1.0), ("offloaded", 0.0)):
                b = batches[mode]
                prompts = [torch.randint(2, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist() for _ in range(b)]
                tps = decode_tokens_per_s(reader, gpu, b, gpu_mem, prompts, args.gen_len)
                best[mode] = max(best.get(mode, 0.0), tps)
                print(f"  {mode:10s} batch {b:3d}: decode {tps:8.1f} tok/s")
        print(f"decode tok/s offloaded / all-on-gpu: {best['offloaded'] / best['gpu cache']:.2f}x "
              f"at {batches['offloaded'] / batches['gpu cache']:.2f}x the batch")


if __name__ == "__main__":
    main()
