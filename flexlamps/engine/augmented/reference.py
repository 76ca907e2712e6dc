"""The uninterrupted generation of augmented requests, to check the engine against.

Each request alone in its own row of a dense cache, greedy: decode each segment's tokens,
append the call's returned tokens, go on; no pause, no swap, no recompute. The augmented
engine must produce exactly these token sequences whatever its policy did with the caches
during the calls. Each request runs alone, so no other row's length shapes its attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flexlamps.workloads.tokenized import TokenizedRequest, total_tokens
from flexlamps.engine.executors.contract import Executor
from flexlamps.engine.executors.step import Step, prompt_step


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
    """Per request id: prompt, sampled and returned tokens, in order (greedy), each request
    generated alone (no other row in its steps, so nothing else shapes its attention)."""
    return {r.spec.request_id: _alone(executor, r) for r in requests}


def _alone(executor: Executor, request: TokenizedRequest) -> list[int]:
    cache = executor.new_cache(1, total_tokens(request.spec) + 1)
    progress = _Progress(request, 0, list(request.prompt_ids))
    try:
        while not progress.done:
            logits = executor.forward_steps(cache, [_step([progress])])[0]
            progress.sample(int(logits[0, 0].argmax()))
    finally:
        cache.release()
    return progress.tokens


def _step(group: list[_Progress]) -> Step:
    """The rows' pending tokens (all of one length) as one micro-batch: a decode where each row's
    one pending token is the one it sampled, else a prompt step (a one-token prompt included), as
    the augmented engine feeds them."""
    n = len(group[0].tokens) - group[0].computed
    slots = torch.tensor([p.row for p in group])
    if n > 1 or group[0].computed == 0:  # computed > 0: the pending token was sampled
        return prompt_step([p.tokens[p.computed:] for p in group], [p.computed for p in group], slots)
    ids = torch.tensor([p.tokens[p.computed:] for p in group])
    pos = torch.stack([torch.arange(p.computed, p.computed + n) for p in group])
    return Step(ids, pos, slots, torch.zeros(len(group), dtype=torch.long))
