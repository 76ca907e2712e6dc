"""The runs the parity tests compare on a tiny checkpoint (tests/checkpoints.py): transformers'
greedy decode with its cache, and ours teacher-forced on its tokens through any executor (in memory
or offloaded)."""

from __future__ import annotations

import json
from pathlib import Path

PROMPT_LEN, DECODE_STEPS = 12, 16  # greedy tokens compared: DECODE_STEPS, past every window below
LOGIT_TOLERANCE = 1e-4


def hf_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def prompt_ids(vocab_size: int, rows: int = 2, seed: int = 1):
    import torch

    return torch.randint(2, vocab_size, (rows, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))


def reference_run(folder: Path, ids, steps: int = DECODE_STEPS):
    """transformers' logits for the prompt and `steps` greedy steps (its cache), and its tokens."""
    import torch
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    logits, tokens = [], []
    with torch.no_grad():
        out = ref(ids, use_cache=True)
        logits.append(out.logits)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(nxt)
            cache = {"cache": out.cache} if hasattr(out, "cache") else {"past_key_values": out.past_key_values}
            out = ref(nxt, use_cache=True, **cache)
            logits.append(out.logits)
    return logits, tokens


def our_run(executor, ids, tokens) -> list:
    """Our logits for the prompt, then one step per reference token (teacher-forced), in `executor`'s
    own cache: the same list shapes as `reference_run`'s logits."""
    import torch

    from flexlamps.engine.executors.step import Step

    n = ids.shape[0]
    cache = executor.new_cache(n, ids.shape[1] + len(tokens) + 1)
    slots = torch.arange(n)
    got = executor.forward_steps(cache, [Step(ids, torch.arange(ids.shape[1]).expand(n, -1), slots)])
    for i, tok in enumerate(tokens):
        got += executor.forward_steps(cache, [Step(tok, torch.full((n, 1), ids.shape[1] + i), slots)])
    if hasattr(cache, "release"):
        cache.release()
    return got


def worst_gap(ours: list, theirs: list) -> float:
    return max((a - b).abs().max().item() for a, b in zip(ours, theirs))


def greedy_tokens(logits: list):
    """The greedy token after each decode step's logits (the reference's tokens, when they agree)."""
    return [step[:, -1:].argmax(-1) for step in logits[:-1]]


def assert_offloaded_equals_in_memory(reader, policy, ids, tokens, folder: Path) -> None:
    """`policy` spreads the weights over gpu / cpu / disk, and its run gives the in-memory logits bit for bit."""
    import torch

    from flexlamps.engine.executors.in_memory import InMemoryExecutor
    from flexlamps.engine.executors.offloaded import OffloadExecutor
    from flexlamps.models.description import model_spec
    from flexlamps.models.loading.checkpoint import read_all

    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=2**30, cpu_mem=2**30, offload_dir=folder)
    try:
        assert {"gpu", "cpu", "disk"} <= set(ex.tiers.values())
        offloaded = our_run(ex, ids, tokens)
    finally:
        ex.close()
    in_memory = our_run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32), ids, tokens)
    assert all(torch.equal(a, b) for a, b in zip(offloaded, in_memory))
