"""How `FlexlampsLM` (flexlamps.evals.lm_eval_model) lays lm_eval's requests on the engine: the
`LLM` each kind of request runs on, parts of a scoring job, HFLM's truncation. No lm_eval here."""

from __future__ import annotations

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
    """`order`'s indices in consecutive parts of about `chunk_tokens` tokens of pairs each (at
    least one index a part); `pairs_of[i]` are the pairs index i scores."""
    part: list[int] = []
    tokens = 0
    for i in order:
        size = sum(len(c) + len(k) for c, k in pairs_of[i])
        if part and tokens + size > chunk_tokens:
            yield part
            part, tokens = [], 0
        part.append(i)
        tokens += size
    if part:
        yield part


class Engines:
    """The `LLM` each kind of request ("score", "generate") runs on. In memory, or with a
    placement given, one engine answers every kind. With placement "auto" an offloaded engine is
    planned for its first workload (a scorer's packed rows, or decoding sequences), so another
    kind gets a fresh engine planned for it; lm_eval asks for each kind once, so a run plans at
    most twice."""

    def __init__(self, settings):
        from flexlamps import LLM  # lazy (torch): lm_eval's task listing runs without the engine

        self.settings = settings
        self.llm = LLM.from_settings(settings, prepare=False)  # tokenizer and config; weights on first use
        self.kind: str | None = None

    @property
    def replans(self) -> bool:
        return self.settings.offloaded and isinstance(self.settings.policy, str) and self.settings.policy == "auto"

    def for_kind(self, kind: str):
        if self.kind not in (None, kind) and self.replans and self.llm.executor is not None:
            from flexlamps import LLM  # lazy (torch): lm_eval's task listing runs without the engine

            self.llm.close()
            self.llm = LLM.from_settings(self.settings, prepare=False)
        self.kind = kind
        return self.llm

    def close(self) -> None:
        self.llm.close()
