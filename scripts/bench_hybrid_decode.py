"""A hybrid (gated DeltaNet) model's prefill and decode through the in-memory executor at several
delta-rule chunk sizes, side by side in one process (alternating, best of --rounds).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_hybrid_decode.py --threads 1

The model: a random Qwen3.5-shaped checkpoint (hidden 1024, 6 DeltaNet + 2 full-attention layers,
16 key / 16 value heads of 128; tests/checkpoints.py), built once under --model-dir. Each chunk
size is swapped into the modules that read models.hybrid_config.DELTA_RULE_CHUNK for its run (a
benchmark's switch, not an engine option: the state layout follows it); every size gives the same
greedy tokens, checked. Prints tokens/s and each size's ratio to the engine's chunk.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' tiny model builders

SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
             linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)


@contextmanager
def delta_rule_chunk(chunk: int):
    """Run the engine's delta rule on `chunk`-token chunks meanwhile."""
    from flexlamps.engine.caches import state
    from flexlamps.models import hybrid_config
    from flexlamps.models.blocks import aligned_delta_rule, gated_deltanet

    readers = ((hybrid_config, "DELTA_RULE_CHUNK"), (state, "DELTA_RULE_CHUNK"), (gated_deltanet, "CHUNK"),
               (aligned_delta_rule, "CHUNK"))
    saved = (hybrid_config.DELTA_RULE_CHUNK, gated_deltanet.chunk_rule_with_boundaries.__defaults__)
    for module, name in readers:
        setattr(module, name, chunk)
    gated_deltanet.chunk_rule_with_boundaries.__defaults__ = (chunk,)
    try:
        yield
    finally:
        for module, name in readers:
            setattr(module, name, saved[0])
        gated_deltanet.chunk_rule_with_boundaries.__defaults__ = saved[1]


def _run(ex, ids: torch.Tensor, new: int):
    """(prefill seconds, decode seconds, greedy tokens) of one batch."""
    from flexlamps.engine.executors.step import Step

    rows, prompt = ids.shape
    cache = ex.new_cache(rows, prompt + new)
    t0 = time.perf_counter()
    logits = ex.forward_steps(cache, [Step(ids, torch.arange(prompt).expand(rows, -1), torch.arange(rows))])[0]
    t1 = time.perf_counter()
    tokens = [logits[:, -1:].argmax(-1)]
    for i in range(new - 1):
        step = Step(tokens[-1], torch.full((rows, 1), prompt + i), torch.arange(rows))
        tokens.append(ex.forward_steps(cache, [step])[0][:, -1:].argmax(-1))
    return t1 - t0, time.perf_counter() - t1, torch.cat(tokens, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/flexlamps/bench-hybrid")
    ap.add_argument("--chunks", default="64,16,8")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=48, help="tokens generated per row")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from flexlamps.engine.executors.in_memory import InMemoryExecutor
    from flexlamps.models.hybrid_config import DELTA_RULE_CHUNK
    from flexlamps.models.loading.checkpoint import read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from tests.checkpoints import make_checkpoint

    if not (a.model_dir / "config.json").exists():
        make_checkpoint(a.model_dir, "qwen3_5_text", 0, **SHAPE)
    reader = open_checkpoint(a.model_dir)
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    ids = torch.randint(2, reader.config.vocab_size, (a.rows, a.prompt), generator=torch.Generator().manual_seed(0))
    chunks = [int(c) for c in a.chunks.split(",")]
    best = {c: [float("inf"), float("inf")] for c in chunks}
    tokens = {}
    for _ in range(a.rounds):
        for c in chunks:
            with delta_rule_chunk(c):
                prefill, decode, tokens[c] = _run(ex, ids, a.new)
            best[c] = [min(best[c][0], prefill), min(best[c][1], decode)]
    same = all(torch.equal(tokens[c], tokens[chunks[0]]) for c in chunks)
    print(f"Qwen3.5-shaped model, {a.rows} rows, {a.prompt}-token prompts, {a.new} new tokens, float32, "
          f"{a.threads} thread(s); greedy tokens the same at every chunk: {same}")
    ref = best.get(DELTA_RULE_CHUNK, best[chunks[0]])
    for c in chunks:
        prefill, decode = a.rows * a.prompt / best[c][0], a.rows * a.new / best[c][1]
        mark = " (the engine's)" if c == DELTA_RULE_CHUNK else ""
        print(f"chunk {c:>3}{mark}: prefill {prefill:7.1f} tok/s ({ref[0] / best[c][0]:.2f}x), "
              f"decode {decode:6.1f} tok/s ({ref[1] / best[c][1]:.2f}x)")


if __name__ == "__main__":
    main()
