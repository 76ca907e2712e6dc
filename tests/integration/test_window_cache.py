"""Sliding windows as a cache property, on tiny random Mistral checkpoints (window 12): a window
layer keeps a ring of its last 12 positions (engine.caches.window), and a prompt of 30 tokens in
two chunks plus 40 decode steps far past the window still gives transformers' logits (<= 1e-4,
its greedy tokens), the whole row's masked attention bit for bit, and the same bits offloaded
(weights over gpu / cpu / disk, the cache on either tier). A sequence's cache bytes per layer stop
growing at the window, in memory and on the offload executor's tiers; a prefix longer than the
window is shared through the rings with the bits of computing it per prompt; the augmented engine's
paged cache keeps a ring of blocks per request, and requests swapped out, discarded or preserved
during their calls resume with the tokens of uninterrupted generation."""

import pytest
import torch

import flexlamps.engine.caches.dense as dense_cache
from flexlamps.engine.augmented.engine import StepClock
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import AgentsConfig, run_policy_on_engine
from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.batch.scoring import PrefixStats
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.policies import InferCept
from flexlamps.sched.request import RequestSpec, Segment, Strategy
from flexlamps.workloads.tokenized import tokenize_requests
from placement import Policy, TierSplit
from tests.checkpoints import make_checkpoint
from tests.family_models import LOGIT_TOLERANCE, greedy_tokens, reference_run, worst_gap

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
    return make_checkpoint(tmp_path_factory.mktemp("mistral") / "mistral-window", "mistral_window", 3,
                           sliding_window=WINDOW)


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
        ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                             gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / mix)
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
        executors[mix] = OffloadExecutor(reader, OFFLOADED[mix], model_spec=model_spec(reader.config),
                                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / mix)
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


class Forced(InferCept):
    """INFERCEPT's order, but every intercepted request gets `strategy`."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    def choose_strategies(self, reqs, ctx):
        return {r.request_id: self.strategy for r in reqs}


@pytest.mark.parametrize("strategy, offloaded", [(s, False) for s in Strategy] + [(Strategy.SWAP, True)])
def test_augmented_requests_keep_rings_of_blocks_and_resume_exactly(mistral, strategy, offloaded, tmp_path):
    """6 requests of 39-49 tokens (past the window of 12) with two calls each, in blocks of 4: each
    holds at most 3 blocks (its ring), and swap, discard or preserve during the calls gives the
    tokens of generating each request alone (in memory; offloaded: weights over gpu / cpu / disk)."""
    reader = open_checkpoint(mistral)
    cfg = reader.config
    plain = InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32)
    runs_on = OffloadExecutor(reader, OFFLOADED["cache_gpu"], model_spec=model_spec(reader.config),
                              gpu_mem=GiB, cpu_mem=GiB,
                              offload_dir=tmp_path / "off") if offloaded else plain
    specs = [RequestSpec(f"r{i}", 14 + 2 * i, (Segment(6 + i % 3, "qa", 0.03, 3), Segment(8, "math", 0.02, 2),
                                              Segment(6)), arrival_time=0.01 * i, kind="qa") for i in range(6)]
    reqs = tokenize_requests(specs, cfg.vocab_size, set(cfg.eos_token_ids) | {0, 1})
    per_token = cfg.kv_bytes_per_token(4)
    config = AgentsConfig(gpu_kv_bytes=10 * 4 * per_token, cpu_swap_bytes=6 * 4 * per_token, block_size=4,
                          max_num_seqs=4, max_num_batched_tokens=24)
    cost = CostModel(overhead_s=0.02, weights_read_s=0.0, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3,
                     kv_read_per_token_s=1e-6, swap_bytes_per_s=1e9, kv_bytes_per_token=per_token,
                     gpu_kv_tokens=40, cpu_swap_tokens=24, max_model_len=64)
    widest = []
    res = run_policy_on_engine(runs_on, reqs, Forced(strategy), config, cost, clock=StepClock(0.01), check=True,
                               on_iteration=lambda s: widest.append(max(map(len, s.bm.gpu_tables.values()),
                                                                        default=0)))
    runs_on.close()
    assert max(widest) == 3  # ceil(12 / 4): no request holds more, though all outgrow the window
    assert res.stats.strategies[strategy.value] > 0
    if strategy is Strategy.SWAP:
        assert res.stats.swap_tokens > 0
    if strategy is Strategy.DISCARD:
        assert res.stats.recompute_tokens > 0
    assert res.tokens == uninterrupted_tokens(plain, reqs)
