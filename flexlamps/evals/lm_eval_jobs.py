"""How `FlexlampsLM` (flexlamps.evals.lm_eval_model) lays lm_eval's requests on the engine: the
`LLM` each kind of request runs on, parts of a scoring job, HFLM's truncation. No lm_eval here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence


def truncate_pair(context: list[int], continuation: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """HFLM's left truncation: context and continuation together keep their last max_length + 1
    tokens (the last one is only predicted), the continuation whole."""
    if len(continuation) > max_length:
        raise ValueError(f"a continuation of {len(continuation)} tokens is longer than max_length {max_length}")
    whole = (context + continuation)[-(max_length + 1):]
    return whole[: len(whole) - len(continuation)], continuation


def score_chunks(order: Iterable[int], pairs_of: Sequence[Sequence[tuple[list[int], list[int]]]],
                 chunk_tokens: int) -> Iterator[list[int]]:
    """`order`'s indices in consecutive parts of about `chunk_tokens` computed tokens each (at
    least one index a part); `pairs_of[i]` are the pairs index i scores. A part of a sixteenth
    of that or more also ends before an index that would cost it more than that index alone: one
    whose context leaves the part's shared root (another subject's few-shot examples) would make
    every context of the part compute what the root held. (Smaller parts keep growing: their
    steps would be too short to run the GEMMs well.)"""
    part: list[int] = []
    cost = PartCost()
    for i in order:
        grown, alone = cost.plus(pairs_of[i]), PartCost().plus(pairs_of[i])
        leaves_root = cost.tokens >= chunk_tokens // 16 and grown.tokens - cost.tokens > alone.tokens
        if part and (grown.tokens > chunk_tokens or leaves_root):
            yield part
            part, grown = [], alone
        part.append(i)
        cost = grown
    if part:
        yield part


@dataclass(frozen=True)
class PartCost:
    """Tokens the scorer computes for the pairs of one call (`LLM.score_ids`): the root their
    contexts share once (each context keeps its last token out of it), each distinct context
    past the root, every continuation."""
    first: tuple[int, ...] | None = None  # the root is a prefix of this context
    shared: int = 0  # tokens every context shares with `first`, less one
    num_pairs: int = 0
    contexts: frozenset = frozenset()  # the distinct contexts
    context_tokens: int = 0  # of the distinct contexts
    continuation_tokens: int = 0

    def plus(self, pairs: Sequence[tuple[list[int], list[int]]]) -> "PartCost":
        if not pairs:
            return self
        first = self.first if self.first is not None else tuple(pairs[0][0])
        shared = self.shared if self.first is not None else len(first)
        for ctx, _ in pairs:
            shared = min(shared, len(os.path.commonprefix([first, tuple(ctx)])), len(ctx) - 1)
        new = {tuple(c) for c, _ in pairs} - self.contexts
        return PartCost(first=first, shared=shared, num_pairs=self.num_pairs + len(pairs),
                        contexts=self.contexts | new, context_tokens=self.context_tokens + sum(map(len, new)),
                        continuation_tokens=self.continuation_tokens + sum(len(k) for _, k in pairs))

    @property
    def tokens(self) -> int:
        root = self.shared if self.num_pairs > 1 else 0
        return root + self.context_tokens - len(self.contexts) * root + self.continuation_tokens


class Engines:
    """The `LLM` (flexlamps.api) each kind of request ("score", "generate") runs on: one object. In
    memory, or with a placement given, one engine answers every kind. With placement "auto" an
    offloaded engine is planned for its first workload (a scorer's packed rows, or decoding
    sequences), so another kind has the LLM plan again (`LLM.replan`) for its own; lm_eval asks for
    each kind once, so a run plans at most twice."""

    def __init__(self, llm):
        self.llm = llm
        self.kind: str | None = None

    @property
    def replans(self) -> bool:
        settings = self.llm.settings
        return settings.offloaded and isinstance(settings.policy, str) and settings.policy == "auto"

    def for_kind(self, kind: str):
        if self.kind not in (None, kind) and self.replans and self.llm.executor is not None:
            self.llm.replan()
        self.kind = kind
        return self.llm

    def close(self) -> None:
        self.llm.close()
