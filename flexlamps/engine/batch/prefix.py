"""Shared token prefixes: find the one a batch of sequences starts with, and compute a prefix's
KV cache once into a one-row cache that callers copy into each sequence's rows."""

from __future__ import annotations

import torch

from flexlamps.engine.executors.contract import Executor
from flexlamps.engine.executors.step import Step


def common_prefix_length(seqs: list[list[int]]) -> int:
    """Tokens every sequence in `seqs` starts with."""
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != first[i] for s in seqs):
            return i
    return n


def prefill_prefix(executor: Executor, new_ids: list[int], parent=None, parent_len: int = 0):
    """A one-row cache holding parent's first `parent_len` positions + `new_ids`, computing only
    `new_ids`. Returns the cache and the fp32 logits after its last token."""
    total = parent_len + len(new_ids)
    cache = executor.new_cache(1, total)
    if parent is not None:
        cache.copy_prefix_from(parent, parent_len, torch.tensor([0]))
    step = Step(torch.tensor([new_ids]), torch.arange(parent_len, total)[None], torch.tensor([0]),
                logit_rows=torch.tensor([len(new_ids) - 1]))
    logits = executor.forward_steps(cache, [step])[0]
    return cache, logits[0, 0]
