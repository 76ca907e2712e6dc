"""Sliding windows as a cache property, on tiny random Mistral checkpoints (window 12): a window
layer keeps a ring of its last 12 positions (engine.caches.window), and a prompt of 30 tokens in
two chunks plus 40 decode steps far past the window still gives transformers' logits (<= 1e-4,
its greedy tokens), the whole row's masked attention bit for bit, and the same bits offloaded
(weights over gpu / cpu / disk, the cache on either tier). A sequence's cache bytes per layer stop
growing at the window, in memory and on the offload executor's tiers; a prefix longer than the
window is shared through the rings with the bits of computing it per prompt."""

import pytest
import torch

import flexlamps.engine.caches.dense as dense_cache
from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.batch.scoring import PrefixStats
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.family_models import LOGIT_TOLERANCE, WIDTHS, greedy_tokens, make_family_model, reference_run, worst_gap

GiB = 2**30
WINDOW, PROMPT, DECODE = 12, 30, 40
ON_GPU = TierSplit(gpu=1, cpu=0, disk=0)
SPREAD = TierSplit(gpu=0.3, cpu=0.3, disk=0.4)
OFFLOADED = {
    "cache_gpu": Policy(gpu_batch_size=2, num_gpu_batches=1, weights=SPREAD, cache=ON_GPU, activations=ON_GPU),
    "cache_cpu_staged": Policy(gpu_batch_size=2, num_gpu_batches=1, weights=SPREAD,
                               cache=TierSplit(gpu=0, cpu=1, disk=0), activations=ON_GPU),
    "cache_cpu_attention": Policy(gpu_batch_size=2, num_gpu_batches=1, weights=SPREAD,
                                  cache=TierSplit(gpu=0, cpu=1, disk=0), activations=ON_GPU, cpu_attention=True),
}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    spec = {**WIDTHS["narrow"], "model_type": "mistral", "num_hidden_layers": 2, "sliding_window": WINDOW}
    return make_family_model(tmp_path_factory.mktemp("mistral") / "mistral-window", spec, seed=3)


def _ids(vocab: int, rows: int = 2, seed: int = 7) -> torch.Tensor:
    return torch.randint(2, vocab, (rows, PROMPT), generator=torch.Generator().manual_seed(seed))


def _chunked_run(executor, ids, tokens) -> list:
    """The prompt in two chunks (18 tokens from position 0, then 12 more), then one decode step per
    reference token: logits shaped as `reference_run`'s (the prompt's as one tensor)."""
    n, split = ids.shape[0], 18
    cache = executor.new_cache(n, PROMPT + len(tokens) + 1)
    slots = torch.arange(n)
    first, second = (executor.forward_steps(cache, [Step(ids[:, a:b], torch.arange(a, b).expand(n, -1), slots)])[0]
                     for a, b in ((0, split), (split, PROMPT)))
    got = [torch.cat([first, second], dim=1)]
    for i, tok in enumerate(tokens):
        got += executor.forward_steps(cache, [Step(tok, torch.full((n, 1), PROMPT + i), slots)])
    cache.release()
    return got


def test_rings_match_transformers_and_the_masked_rows_in_memory_and_offloaded(mistral, tmp_path, monkeypatch):
    reader = open_checkpoint(mistral)
    ids = _ids(reader.config.vocab_size)
    expected, tokens = reference_run(mistral, ids, steps=DECODE)
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    assert plain.new_cache(2, PROMPT + DECODE).k[0].shape[2] == WINDOW  # a ring, not the context
    ours = _chunked_run(plain, ids, tokens)
    gap = worst_gap(ours, expected)
    assert gap <= LOGIT_TOLERANCE, f"max |logit difference| {gap:.3g}"
    assert all(torch.equal(a, b) for a, b in zip(greedy_tokens(ours), tokens)), "greedy tokens differ"
    for mix, policy in OFFLOADED.items():
        ex = OffloadExecutor(reader, policy, gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / mix)
        offloaded = _chunked_run(ex, ids, tokens)
        ex.close()
        for step, (a, b) in enumerate(zip(ours, offloaded)):
            assert torch.equal(a, b), f"{mix}: offloaded differs from in memory at step {step}"
    with monkeypatch.context() as patch:  # the path before rings: whole rows, the window in the mask
        patch.setattr(dense_cache, "layer_rings", lambda cfg, capacity, compressed=False: [None] * cfg.num_layers)
        masked = _chunked_run(plain, ids, tokens)
    assert all(torch.equal(a, b) for a, b in zip(ours, masked)), "rings differ from the masked whole rows"


def test_a_sequences_cache_bytes_stop_growing_past_the_window(mistral, tmp_path):
    """One row's cache at growing capacities: the same bytes from the window on, in memory and as
    the offload executor charges its tiers (cache on the gpu tier, and on the cpu tier)."""
    reader = open_checkpoint(mistral)
    cfg = reader.config
    per_token = cfg.kv_bytes_per_token(4)  # float32, every layer
    plain = InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32)
    executors = {"in_memory": plain}
    for mix in ("cache_gpu", "cache_cpu_staged"):
        executors[mix] = OffloadExecutor(reader, OFFLOADED[mix], gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / mix)
    measured = {}
    for name, ex in executors.items():
        for capacity in (4, WINDOW, 2 * WINDOW, 100, 1000):
            before = sum(use.used_bytes for use in ex.tier_use().values())
            cache = ex.new_cache(1, capacity)
            held = cache.nbytes if name == "in_memory" else sum(u.used_bytes for u in ex.tier_use().values()) - before
            cache.release()
            measured[name, capacity] = held
            assert held == min(capacity, WINDOW) * per_token, (name, capacity, held)
        ex.close()
    print({f"{name} capacity {c}": b for (name, c), b in measured.items()})


def test_a_prefix_longer_than_the_window_is_shared_through_the_rings(mistral):
    """generate's shared prefix (20 tokens, past the window of 12) computed once into a one-row cache
    of rings and copied into each sequence's: transformers' greedy tokens, and the log-probs of
    computing every prompt whole."""
    reader = open_checkpoint(mistral)
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    ids = _ids(reader.config.vocab_size, rows=3, seed=11)
    ids[:, :20] = ids[0, :20]
    prompts = [ids[0, :30].tolist(), ids[1, :26].tolist(), ids[2, :24].tolist()]
    params = [SamplingParams(max_new_tokens=DECODE, ignore_eos=True, logprobs=True)] * 3
    stats = PrefixStats()
    shared = generate(plain, reader.tokenizer, prompts, params, stats=stats)
    assert stats.prefill_tokens_computed == 20 + 10 + 6 + 4  # the prefix once
    alone = generate(plain, reader.tokenizer, prompts, params, reuse_prefix=False)
    for prompt, a, b in zip(prompts, shared, alone):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
        _, tokens = reference_run(mistral, torch.tensor([prompt]), steps=DECODE)
        assert a.token_ids == torch.cat(tokens, dim=1)[0].tolist()
