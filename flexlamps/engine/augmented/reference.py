"""The uninterrupted generation of augmented requests, to check the engine against.

Each request alone in its own row of a dense cache, greedy: decode each segment's tokens,
append the call's returned tokens, go on; no pause, no swap, no recompute. The augmented
engine must produce exactly these token sequences whatever its policy did with the caches
during the calls. The requests advance together, one executor sweep per sampled token (rows
are independent), so an offloaded executor streams its weights once per step for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flexlamps.workloads.tokenized import TokenizedRequest, total_tokens
from flexlamps.engine.executors.contract import Executor
from flexlamps.engine.executors.step import Step


@dataclass
class _Progress:
    request: TokenizedRequest
    row: int
    tokens: list[int]
    computed: int = 0
    segment: int = 0
    sampled: int = 0  # tokens sampled in the current segment
    done: bool = False

    def sample(self, token: int) -> None:
        self.computed = len(self.tokens)
        self.tokens.append(token)
        self.sampled += 1
        if self.sampled == self.request.spec.segments[self.segment].completion_tokens:
            self.tokens.extend(self.request.returned_ids[self.segment])
            self.segment, self.sampled = self.segment + 1, 0
            self.done = self.segment == len(self.request.spec.segments)


def uninterrupted_tokens(executor: Executor, requests: list[TokenizedRequest]) -> dict[str, list[int]]:
    """Per request id: prompt, sampled and returned tokens, in order (greedy)."""
    if not requests:
        return {}
    cache = executor.new_cache(len(requests), max(total_tokens(r.spec) for r in requests) + 1)
    progress = [_Progress(r, row, list(r.prompt_ids)) for row, r in enumerate(requests)]
    live = list(progress)
    try:
        while live:
            decodes = [p for p in live if len(p.tokens) - p.computed == 1]
            groups = ([decodes] if decodes else []) + [[p] for p in live if len(p.tokens) - p.computed > 1]
            logits = executor.forward_steps(cache, [_step(group) for group in groups])
            for group, out in zip(groups, logits):
                for p, row in zip(group, out[:, 0]):
                    p.sample(int(row.argmax()))
            live = [p for p in live if not p.done]
    finally:
        cache.release()
    return {p.request.spec.request_id: p.tokens for p in progress}


def _step(group: list[_Progress]) -> Step:
    """The rows' pending tokens (all of one length) as one micro-batch."""
    n = len(group[0].tokens) - group[0].computed
    ids = torch.tensor([p.tokens[p.computed:] for p in group])
    pos = torch.stack([torch.arange(p.computed, p.computed + n) for p in group])
    return Step(ids, pos, torch.tensor([p.row for p in group]), torch.full((len(group),), n - 1))
