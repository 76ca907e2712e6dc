"""Sampling parameters and next-token selection (greedy, temperature, top-k, top-p, seeded)."""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass, field

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's limit


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    seed: int | None = None  # per-request seed: the same seed gives the same tokens in any batch
    stop: tuple[str, ...] = field(default_factory=tuple)  # stop strings, excluded from the text
    logprobs: bool = False  # return the log-probability of each generated token
    top_logprobs: int = 0  # with logprobs: also the k most likely tokens at each step, with theirs
    ignore_eos: bool = False
    n: int = 1  # samples of the prompt, sharing its prefill; sample k > 0 seeds from (seed, k)
    json_schema: str | None = None  # JSON text of a schema every sample must follow (grammar.py)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {self.top_logprobs}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sample_seed(self, sample: int) -> int | None:
        """The seed of sample `sample` of the prompt: `seed` itself for the first."""
        if self.seed is None or sample == 0:
            return self.seed
        return zlib.crc32(f"{self.seed}:{sample}".encode())

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "SamplingParams":
        return cls(**json.loads(text))


class NonFiniteLogitsError(ValueError):
    """The model computed NaN (or +inf) logits: no token or log-probability can come of them."""


NON_FINITE = ("the model computed NaN logits: its weights hold NaN or infinite values (a damaged or badly converted "
              "checkpoint: convert or download it again), or float16 overflowed (try --dtype bfloat16 or float32)")


def check_finite(chosen: torch.Tensor) -> None:
    """`chosen`: per row, the logit (or log-probability) a step picked. NaN anywhere in a row's
    logits makes its argmax NaN (NaN counts as the maximum), so checking these few values
    catches a model whose weights hold NaN at every step's cost of a gather: checking every
    weight at load would be a pass over all of them (a 70B model's 140 GB) on every load."""
    if bool((torch.isnan(chosen) | torch.isposinf(chosen)).any()):
        raise NonFiniteLogitsError(NON_FINITE)


def make_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to one row of fp32 logits."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop tokens once the mass before them already reaches top_p (the first token always stays)
        drop = (cum - sorted_logits.softmax(-1)) >= params.top_p
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim (the first of equal maxima; a NaN counts as the maximum, as in
    torch). On the CPU numpy's vectorized argmax runs it: torch's takes ~55 us for SmolLM2's 49k
    logits at one thread, numpy's ~5 (a batch-1 decode step is ~25 ms)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return logits.argmax(-1)
    return torch.from_numpy(logits.numpy().argmax(-1))


def top_tokens(log_probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, token ids) of the `k` largest entries of each row of `log_probs` (n, vocab), in
    descending order, equal values by the lower token id. torch.topk orders equal values as its
    kernel meets them, which moves with the rows beside a row (seen: an offloaded run's tie
    listed in the other order), so only the k-th value is taken from it."""
    kth = torch.topk(log_probs, k, -1).values[:, -1]  # (n,)
    values, ids = [], []
    for row, least in zip(log_probs, kth):
        candidates = torch.nonzero(row >= least)[:, 0]  # ascending ids: k, or more where the k-th ties
        order = torch.sort(row[candidates], descending=True, stable=True).indices[:k]
        values.append(row[candidates[order]])
        ids.append(candidates[order])
    return torch.stack(values), torch.stack(ids)


def select_tokens(logits: torch.Tensor, params: list[SamplingParams],
                  generators: list[torch.Generator | None]) -> torch.Tensor:
    """Next token per row of `logits` (n, vocab), fp32."""
    tokens = greedy_tokens(logits)
    check_finite(logits.gather(-1, tokens[:, None].to(logits.device)))
    for i, p in enumerate(params):
        if not p.greedy:
            probs = filter_logits(logits[i], p).softmax(-1)
            tokens[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
    return tokens
