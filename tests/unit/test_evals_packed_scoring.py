"""Scoring packs many questions' continuations per forward: it must equal scoring each
(context, continuation) as one plain sequence, in memory and offloaded, however it is chunked."""

import pytest
import torch

from flexlamps import LLM
from flexlamps.engine.batch.scoring import PrefixScorer, split_tokens

SHOTS = "the quick brown fox jumps over the lazy dog.\n\n"
QUESTIONS = [  # (context, choices): varied lengths, choice counts, one-token and shared endings
    ("hello world, this is", [" a tiny", " tokenizer for tests", "!", " the"]),
    ("numbers 0 1 2", [" 3", " 3 4 5 6 7 8", " fox"]),
    ("Once upon a time", [" there was a model", " 9"]),
    ("hello world, this is", [" numbers"]),  # the same context again, in another group
    ("a model that fit", [" on a small GPU.", " on", " in a huge data center far away", " dog", " ?"]),
    ("lazy", [" dog", " cat"]),
]


def _pairs(tok, shots=SHOTS):
    out = []
    for ctx, choices in QUESTIONS:
        out += [split_tokens(tok, shots + ctx, c) for c in choices]
    return out


def _plain(llm, pairs):
    scorer = PrefixScorer(llm.executor, max_batch=4, reuse_prefix=False)
    return scorer.score(pairs)


# packed and plain scoring give the same fp32 log-probs bit for bit: each segment attends over its
# own keys gathered to start at 0, and attention on the CPU does not depend on what shares its step
# (so these engines run on the CPU where a GPU is present: cuBLAS picks kernels by shape)


@pytest.mark.parametrize("max_batch,micro_batch,max_logit_positions,step_tokens,row_tokens",
                         [(32, None, 2048, 1024, 128), (2, None, 6, 1024, 128), (3, 2, 2048, 1024, 16),
                          (32, None, 2048, 8, 1), (32, None, 2048, 1024, None), (2, None, 6, 1024, None)])
def test_packed_equals_plain_sequences(tiny_llama, max_batch, micro_batch, max_logit_positions, step_tokens,
                                       row_tokens):
    """Packed rows (row_tokens) and, for caches that cannot pack, rounds of continuations (None)."""
    llm = LLM(str(tiny_llama), device="cpu")
    pairs = _pairs(llm.tokenizer)
    ref = _plain(llm, pairs)
    calls = []
    forward = llm.executor.forward_steps
    llm.executor.forward_steps = lambda cache, steps: calls.append(steps) or forward(cache, steps)
    packed = PrefixScorer(llm.executor, max_batch=max_batch, micro_batch=micro_batch,
                          max_logit_positions=max_logit_positions, step_tokens=step_tokens, row_tokens=row_tokens)
    got = packed.score(pairs)
    assert [o.logprob for o in got] == [o.logprob for o in ref]
    assert [o.num_tokens for o in got] == [o.num_tokens for o in ref]
    assert [o.is_greedy for o in got] == [o.is_greedy for o in ref]
    assert [o.token_logprobs for o in got] == [o.token_logprobs for o in ref]
    assert packed.stats.prefill_tokens_computed < 0.5 * packed.stats.prefill_tokens_requested
    question_steps = [s for steps in calls[1:] for s in steps]  # after the shared examples' call
    assert all((s.segments is not None) == (row_tokens is not None) for s in question_steps)
    if max_batch == 32 and row_tokens != 1:  # one call for the shared examples, one for every question
        assert len(calls) == 2
    if row_tokens == 128:  # every question's context and choices in one step, in one row of <= 128
        assert len(question_steps) == 1 and question_steps[0].input_ids.shape[1] <= 128


def test_offloaded_packed_scoring_equals_in_memory(tiny_llama):
    from placement import Policy, TierSplit

    g, c = TierSplit(gpu=1, cpu=0, disk=0), TierSplit(gpu=0, cpu=1, disk=0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=c, cache=c, activations=g)
    mem = LLM(str(tiny_llama))
    off = LLM(str(tiny_llama), gpu_mem="64MiB", cpu_mem="64MiB", policy=policy)
    contexts = [SHOTS + ctx for ctx, choices in QUESTIONS for _ in choices]
    conts = [ch for _, choices in QUESTIONS for ch in choices]
    a, b = mem.score(contexts, conts), off.score(contexts, conts)
    assert [o.logprob for o in b] == [o.logprob for o in a]
    assert off.executor.budgets["gpu"].used_bytes == sum(
        t.numel() * t.element_size() for n, t in off.executor.store._resident.items()
        if off.executor.store.tier_of(n) == "gpu")  # every cache freed


def test_no_shared_root_and_single_pair(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu")
    for pairs in (_pairs(llm.tokenizer, shots="")[:1], _pairs(llm.tokenizer, shots="")):
        got = PrefixScorer(llm.executor).score(pairs)
        assert [o.logprob for o in got] == [o.logprob for o in _plain(llm, pairs)]
    with torch.no_grad():
        assert PrefixScorer(llm.executor).score([]) == []


# (rewinds, packs_rows): packed rows, rounds of continuations over a row, one pair a row
PATHS = {"packed": (True, True), "rounds": (True, False), "leaves": (False, False)}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("rows,slack,prefix", [(2, 0, 0), (3, 0, 1000), (1, 0, 0), (4, 40, 1000)])
def test_scoring_keeps_to_the_planned_geometry(tiny_llama, path, rows, slack, prefix):
    """Under an offloaded plan's `ScoreLimits` (what its dry run charged) every call holds at most
    the plan's rows (one more for a planned root), rows of at most its positions, steps of at most
    `micro_batch` rows and logits at most `positions` a row; scores equal the plain sequences'."""
    from flexlamps.engine.batch.scoring import ScoreLimits, planning_positions

    llm = LLM(str(tiny_llama), device="cpu")
    pairs = _pairs(llm.tokenizer)
    _, root, fewest = planning_positions(pairs)
    logits = fewest + slack - (root if root <= prefix else 0)  # as Workload.logits_per_row
    limits = ScoreLimits(rows=rows, positions=fewest + slack, prefix=prefix, logits=logits)
    ref = _plain(llm, pairs)
    ex, caches, calls = llm.executor, [], []
    new_cache, forward = ex.new_cache, ex.forward_steps
    ex.new_cache = lambda n, cap: caches.append((n, cap)) or new_cache(n, cap)
    ex.forward_steps = lambda cache, steps: calls.append(steps) or forward(cache, steps)
    scorer = PrefixScorer(ex, max_batch=rows, micro_batch=max(1, rows // 2), limits=limits)
    rewinds, packs = PATHS[path]
    scorer._flags = {"rewinds": rewinds, "packs_rows": packs}
    got = scorer.score(pairs)
    assert [o.token_logprobs for o in got] == [o.token_logprobs for o in ref]
    root_planned = root <= prefix
    if rows == 1:
        assert all(n == 1 and cap <= limits.positions + 1 for n, cap in caches)  # no root: a block of one
    assert all(n <= rows - (not root_planned and n != 1) and cap <= limits.positions + 1 for n, cap in caches[1:])
    for steps in calls:
        assert sum(s.input_ids.numel() for s in steps) <= rows * limits.positions
        for s in steps:
            assert s.input_ids.shape[0] <= max(1, rows // 2) and s.span <= limits.positions
            logits = s.input_ids.shape[1] if s.logit_rows is None else s.logit_rows.reshape(len(s.slots), -1).shape[1]
            assert logits <= limits.logits


def test_an_engine_planned_for_generation_refuses_to_score(tiny_llama):
    from flexlamps.engine.batch.scoring import ScoreLimits

    llm = LLM(str(tiny_llama), device="cpu")
    scorer = PrefixScorer(llm.executor, limits=ScoreLimits(rows=4, positions=64, prefix=0, logits=1))
    with pytest.raises(ValueError, match="planned for generation"):
        scorer.score(_pairs(llm.tokenizer))
    scorer = PrefixScorer(llm.executor, limits=ScoreLimits(rows=4, positions=8, prefix=0, logits=8))
    with pytest.raises(ValueError, match="score request 0 has"):
        scorer.score(_pairs(llm.tokenizer))
