"""What keeping an FP8 checkpoint's matrices in FP8 costs and saves: tiny random DeepSeek-V3
models (the tests' 64-wide one, and a wider one with whole 128x128 tiles) rewritten as FP8
checkpoints, run by the in-memory executor and by the offload executor (weights on the cpu
tier) with the matrices kept FP8 and upcast per call, against the same values dequantized
(a dense checkpoint of them: what dequantizing at load gives).
Prints the layers' weight bytes each way and decode ms per step (best of --repeats, the two
alternating in one process) and their ratios; checks the logits are equal.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_fp8_weights.py [--batch 8 --steps 16 --repeats 5]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' tiny model builders

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import CHECKPOINTS, to_fp8_checkpoint

WIDE = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=4,
            kv_lora_rank=256, q_lora_rank=384, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=256,
            n_group=2, topk_group=1, first_k_dense_replace=1, num_hidden_layers=3, max_position_embeddings=512)
PROMPT_LEN = 32


def build(folder: Path, spec: dict) -> Path:
    import transformers

    from tests.conftest import save_tiny_tokenizer

    folder.mkdir(parents=True)
    vocab = save_tiny_tokenizer(folder)
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(vocab_size=vocab, bos_token_id=0, eos_token_id=1, **spec)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


def decode(ex, vocab: int, batch: int, steps: int) -> tuple[float, list[torch.Tensor]]:
    """Seconds per decode step after a prefill, and the logits of every step."""
    ids = torch.randint(2, vocab, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    cache, slots = ex.new_cache(batch, PROMPT_LEN + steps), torch.arange(batch)
    out = [ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN).expand(batch, -1), slots)])[0]]
    start = time.perf_counter()
    for pos in range(PROMPT_LEN, PROMPT_LEN + steps):
        tokens = out[-1][:, -1].argmax(-1)[:, None]
        out.append(ex.forward_steps(cache, [Step(tokens, torch.full((batch, 1), pos), slots)])[0])
    return (time.perf_counter() - start) / steps, out


def dequantized_copy(src: Path, fp8: Path, dst: Path) -> Path:
    """A dense checkpoint holding the FP8 checkpoint's values dequantized."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    save_file(to_fp8_checkpoint(src, fp8), str(dst / "model.safetensors"))
    return dst


def executors(readers: dict, dtype: torch.dtype, offloaded: bool) -> dict:
    """{kept FP8: executor}: the dense reader's executor (False) and the FP8 one's (True)."""
    if not offloaded:
        return {kept: InMemoryExecutor(r.config, read_all(r, dtype, fp8_in_place=True), dtype)
                for kept, r in readers.items()}
    on_gpu, on_cpu = TierSplit(gpu=1.0, cpu=0.0, disk=0.0), TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
    policy = Policy(gpu_batch_size=64, num_gpu_batches=1, weights=on_cpu, cache=on_gpu, activations=on_gpu)
    return {kept: OffloadExecutor(r, policy, model_spec=model_spec(r.config),
                                  gpu_mem=1 << 32, cpu_mem=1 << 32, dtype=dtype)
            for kept, r in readers.items()}


def layer_bytes(ex) -> int:
    if isinstance(ex, InMemoryExecutor):
        return sum(w.nbytes for layer in ex.layer_weights for w in layer.values())
    return sum(n for name, n in ex.weights.stored.items() if name.startswith("layers."))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = {k: v for k, v in CHECKPOINTS["deepseek_v3"].items() if k != "model_type"}
        for name, spec in (("tiny (hidden 64)", tiny), ("wide (hidden 512)", WIDE)):
            folder = root / name.split()[0]
            dequantized_copy(build(folder / "random", spec), folder / "fp8", folder / "dequantized")
            readers = {False: open_checkpoint(folder / "dequantized"), True: open_checkpoint(folder / "fp8")}
            reader = readers[True]
            for dtype in (torch.float32, torch.bfloat16):
                for offloaded in (False, True):
                    exs = executors(readers, dtype, offloaded)
                    best, logits = {False: float("inf"), True: float("inf")}, {}
                    for _ in range(args.repeats):
                        for kept, ex in exs.items():
                            s, logits[kept] = decode(ex, reader.config.vocab_size, args.batch, args.steps)
                            best[kept] = min(best[kept], s)
                    same = all(torch.equal(a, b) for a, b in zip(logits[False], logits[True]))
                    dense_b, fp8_b = layer_bytes(exs[False]), layer_bytes(exs[True])
                    print(f"{name} {str(dtype)[6:]:8} {'offloaded' if offloaded else 'in memory':9}: "
                          f"layer weights {dense_b / 1e6:.2f} -> {fp8_b / 1e6:.2f} MB ({fp8_b / dense_b:.3f}x); "
                          f"decode {best[False] * 1e3:.2f} -> {best[True] * 1e3:.2f} ms/step "
                          f"({best[True] / best[False]:.2f}x); logits equal: {same}")
                    for ex in exs.values():
                        ex.close()


if __name__ == "__main__":
    main()
