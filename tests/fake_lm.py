"""A deterministic stand-in for `flexlamps.LLM`, for evaluation tests that need no model.

Tokens are UTF-8 bytes; the "model" is a fixed random bigram table, so log-probabilities, greedy
choices and generations are exact and repeatable. `answers` forces what generation returns for a
prompt whose last question contains a key. `stats` counts prefill tokens with shared-prefix
reuse against every prompt seen before, as the real engine reports them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

VOCAB = 256
BOS = 0


@dataclass
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 0.0
    stop: Optional[list[str]] = None
    logprobs: bool = False
    seed: int = 0


@dataclass
class RequestOutput:
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: Optional[list[float]]
    num_prompt_tokens: int


@dataclass
class ScoreOutput:
    logprob: float
    num_tokens: int
    is_greedy: bool
    token_logprobs: list[float]


class ByteTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@dataclass
class EngineStats:
    prefill_tokens_requested: int = 0
    prefill_tokens_computed: int = 0


class FakeLLM:
    def __init__(self, answers: Optional[dict[str, str]] = None, seed: int = 0, fail_after_calls: Optional[int] = None):
        rng = np.random.default_rng(seed)
        logits = rng.standard_normal((VOCAB, VOCAB)) * 3.0
        self.table = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)  # log-softmax rows
        self.tokenizer = ByteTokenizer()
        self.answers = answers or {}
        self.stats = EngineStats()
        self._seen: list[list[int]] = []
        self.calls = 0
        self.fail_after_calls = fail_after_calls

    def _tick(self):
        self.calls += 1
        if self.fail_after_calls is not None and self.calls > self.fail_after_calls:
            raise RuntimeError("fake engine failure (test)")

    def _prefill(self, ids: list[int]) -> None:
        shared = max((len(os.path.commonprefix([ids, s])) for s in self._seen), default=0)
        self.stats.prefill_tokens_requested += len(ids)
        self.stats.prefill_tokens_computed += len(ids) - shared
        self._seen.append(ids)

    def token_logprob(self, prev: int, tok: int) -> float:
        return float(self.table[prev, tok])

    def generate(self, prompts: list[str], params) -> list[RequestOutput]:
        self._tick()
        outs = []
        for p in prompts:
            ids = self.tokenizer.encode(p)
            self._prefill(ids)
            forced = self._forced(p)
            gen: list[int] = []
            lps: list[float] = []
            prev = ids[-1] if ids else BOS
            reason = "length"
            for step in range(params.max_new_tokens):
                tok = forced[step] if forced is not None and step < len(forced) else int(np.argmax(self.table[prev]))
                gen.append(tok)
                lps.append(self.token_logprob(prev, tok))
                prev = tok
                text = self.tokenizer.decode(gen)
                if params.stop and any(s in text for s in params.stop):
                    cut = min(text.index(s) for s in params.stop if s in text)
                    text, reason = text[:cut], "stop"
                    gen = self.tokenizer.encode(text)
                    lps = lps[: len(gen)]
                    break
            outs.append(RequestOutput(self.tokenizer.decode(gen), gen, reason,
                                      lps if params.logprobs else None, len(ids)))
        return outs

    def _forced(self, prompt: str) -> Optional[list[int]]:
        hits = [(prompt.rfind(k), v) for k, v in self.answers.items() if k in prompt]
        if not hits:
            return None
        return self.tokenizer.encode(max(hits)[1])

    def score(self, contexts: list[str], continuations: list[str]) -> list[ScoreOutput]:
        self._tick()
        outs = []
        for ctx, cont in zip(contexts, continuations):
            c_ids, x_ids = self.tokenizer.encode(ctx), self.tokenizer.encode(cont)
            self._prefill(c_ids + x_ids)
            prev = c_ids[-1] if c_ids else BOS
            lps, greedy = [], True
            for tok in x_ids:
                lps.append(self.token_logprob(prev, tok))
                greedy &= int(np.argmax(self.table[prev])) == tok
                prev = tok
            outs.append(ScoreOutput(float(sum(lps)), len(x_ids), greedy, lps))
        return outs
