"""The Python API a vLLM user expects: `LLM(...).generate(prompts, SamplingParams(...))` and `.score`."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from flexlamps.engine.executor import InMemoryExecutor
from flexlamps.engine.generate import RequestOutput, generate
from flexlamps.engine.sampling import SamplingParams
from flexlamps.engine.scoring import PrefixScorer, PrefixStats, ScoreOutput, split_tokens
from flexlamps.models.checkpoint import read_all
from flexlamps.models.registry import open_checkpoint

__all__ = ["LLM", "SamplingParams", "RequestOutput", "ScoreOutput"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not supported; use one of float32, bfloat16, float16") from None


class LLM:
    """A model ready to generate and score.

    model: a built-in name ("smollm2-135m"), a Hugging Face folder or a .gguf file.
    dtype: compute and weight dtype (float32, bfloat16, float16).
    max_batch_size: sequences decoded together (continuous batching).
    """

    def __init__(self, model: str = "smollm2-135m", *, dtype: str = "float32", max_batch_size: int = 32,
                 device: str = "cpu", reuse_prefix: bool = True):
        self.model_name = str(model)
        self.reader = open_checkpoint(model)
        self.config = self.reader.config
        self.tokenizer = self.reader.tokenizer
        self.dtype = parse_dtype(dtype)
        self.max_batch_size = max_batch_size
        self.executor = InMemoryExecutor(self.config, read_all(self.reader, self.dtype), self.dtype, device)
        self._scorer = PrefixScorer(self.executor, max_batch=max_batch_size, reuse_prefix=reuse_prefix)

    @property
    def stats(self) -> PrefixStats:
        """Shared-prefix counters: prefill tokens requested vs computed by `score`."""
        return self._scorer.stats

    def encode_prompt(self, prompt: str, chat: bool = False) -> list[int]:
        if chat:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(prompt)

    def generate(self, prompts: Sequence[str] | str, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, chat: bool = False, on_finish: Callable[[RequestOutput], None] | None = None,
                 on_tokens: Callable[[int], None] | None = None) -> list[RequestOutput]:
        """One `RequestOutput` per prompt, in order. `chat` wraps each prompt in the chat template."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = [self.encode_prompt(p, chat) for p in prompts]
        return generate(self.executor, self.tokenizer, ids, plist, max_batch=self.max_batch_size,
                        on_finish=on_finish, on_tokens=on_tokens)

    def score(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[ScoreOutput]:
        """Log-likelihood of each continuation after its context (shared prefixes computed once)."""
        if len(contexts) != len(continuations):
            raise ValueError(f"{len(contexts)} contexts but {len(continuations)} continuations")
        pairs = [split_tokens(self.tokenizer, c, k) for c, k in zip(contexts, continuations)]
        return self._scorer.score(pairs)
