"""Continuous-batching generation over one executor.

Up to `max_batch` sequences decode together, each in its own cache row; when one finishes,
its row is freed and the next waiting prompt is prefilled into it, so no sequence ever
waits for the longest one in its batch and nothing is padded beyond a prefill group. A prompt
asked for `n` samples runs as `n` sequences that share its prefill (`samples.py`); a sequence
with a JSON schema has its logits masked to what the schema allows (`grammar.py`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from flexlamps.engine.batch.grammar import JsonGrammars, RowGrammar, mask_rows
from flexlamps.engine.batch.prefix import common_prefix_length, prefill_prefix
from flexlamps.engine.batch.samples import SharedPrefills, last_token_step, prefill_tokens_computed
from flexlamps.engine.executors.contract import Executor
from flexlamps.engine.executors.step import Step
from flexlamps.engine.batch.sampling import SamplingParams, make_generator, select_tokens, top_tokens
from placement.specs import prompt_columns


@dataclass
class RequestOutput:
    index: int  # position in the caller's list
    text: str
    token_ids: list[int]
    finish_reason: str  # "eos" | "stop" | "length"
    num_prompt_tokens: int
    logprobs: list[float] | None = None
    stop_string: str | None = None
    sample: int = 0  # which of the prompt's `n` samples
    # with top_logprobs: per generated token, the k most likely (token id, log-probability)
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class _Sequence:
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    sample: int = 0
    grammar: RowGrammar | None = None
    slot: int = -1
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.generated)


class ContextOverflowError(ValueError):
    pass


def generate(executor: Executor, tokenizer, prompts: Sequence[list[int]], params: Sequence[SamplingParams], *,
             max_batch: int = 32, micro_batch: int | None = None, max_context: int | None = None,
             on_finish: Callable[[RequestOutput], None] | None = None,
             on_tokens: Callable[[int], None] | None = None, stats=None,
             reuse_prefix: bool = True, grammars: JsonGrammars | None = None) -> list[RequestOutput]:
    """Generate for every prompt: one RequestOutput per prompt and sample, in that order. With
    `reuse_prefix`, a token prefix shared by all prompts of the call (instructions, in-context
    examples, a system prompt) is computed once and copied into each sequence's cache rows, and
    a prompt's samples share its prefill; `stats` (a PrefixStats) counts prefill tokens
    requested/computed. `grammars` compiles the params' JSON schemas (needed when one is set)."""
    max_context = max_context or executor.cfg.max_position
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if len(p) >= max_context:
            raise ContextOverflowError(
                f"prompt {i} has {len(p)} tokens, the model's context is {max_context}; shorten it")
    seqs = _sequences(prompts, params, grammars)
    if not seqs:
        return []
    capacity = min(max_context, max(s.length + s.params.max_new_tokens for s in seqs))
    num_slots = min(max_batch, len(seqs))
    shared = shared_prefix_length(list(prompts)) if reuse_prefix else 0
    if stats is not None:
        stats.prefill_tokens_requested += sum(len(s.prompt_ids) for s in seqs)
        stats.prefill_tokens_computed += prefill_tokens_computed(
            [(len(p), sp.n) for p, sp in zip(prompts, params)], shared, reuse_prefix)
    run = _Generation(executor, tokenizer, seqs, num_slots, capacity, micro_batch or num_slots, on_finish, on_tokens)
    cache, prefix_cache, samples = executor.new_cache(num_slots, capacity), None, None
    try:
        prefix_cache = prefill_prefix(executor, seqs[0].prompt_ids[:shared])[0] if shared else None
        samples = SharedPrefills(executor, prefix_cache, shared, reuse_prefix)
        run.loop(cache, prefix_cache, shared, samples)
    finally:  # tiered caches hand their bytes back to the tier budgets, even on errors
        if samples is not None:
            samples.release()
        cache.release()
        if prefix_cache is not None:
            prefix_cache.release()
    return run.results  # type: ignore[return-value]


def _sequences(prompts: Sequence[list[int]], params: Sequence[SamplingParams],
               grammars: JsonGrammars | None) -> list[_Sequence]:
    """One sequence per prompt and sample, in that order, each with its own generator and matcher."""
    if grammars is None and any(sp.json_schema is not None for sp in params):
        raise ValueError("a JSON schema was given but no grammar compiler (generate(..., grammars=JsonGrammars(...)))")
    return [_Sequence(i, list(p), sp, make_generator(sp.sample_seed(k)), k,
                      grammars.matcher(sp.json_schema) if sp.json_schema is not None else None)
            for i, (p, sp) in enumerate(zip(prompts, params)) for k in range(sp.n)]


class _Generation:
    """The state of one `generate` call: waiting prompts, running sequences, free cache rows."""

    def __init__(self, executor, tokenizer, seqs, num_slots, capacity, micro_batch, on_finish, on_tokens):
        self.executor, self.tokenizer = executor, tokenizer
        self.capacity, self.micro_batch = capacity, micro_batch
        self.on_finish, self.on_tokens = on_finish, on_tokens
        # longest prompts first: prefill groups of similar length waste less on padding
        self.waiting = deque(sorted(seqs, key=lambda s: -len(s.prompt_ids)))
        self.free = list(range(num_slots))
        self.running: list[_Sequence] = []
        self.results: list[RequestOutput | None] = [None] * len(seqs)
        self.result_index = {(s.index, s.sample): n for n, s in enumerate(seqs)}
        self.stop_checker = _StopChecker(tokenizer)

    def loop(self, cache, prefix_cache, shared: int, samples: SharedPrefills) -> None:
        """One sweep per iteration: the running sequences decode one token and, when rows are
        free, waiting prompts are prefilled in the same sweep (each group a micro-batch of its own;
        samples sharing their prompt's prefill run its last token in micro-batches of their own)."""
        mb = self.micro_batch
        while self.waiting or self.running:
            self.running.sort(key=lambda s: s.slot)
            batches = [self.running[i:i + mb] for i in range(0, len(self.running), mb)]
            steps = [_decode_step(b) for b in batches]
            if self.waiting and self.free:
                group = self._admit()
                if prefix_cache is not None:
                    cache.copy_prefix_from(prefix_cache, shared, torch.tensor([s.slot for s in group]))
                plain, tails = samples.split(group, cache)
                for i in range(0, len(plain), mb):
                    batches.append(plain[i:i + mb])
                    steps.append(_prefill_step(batches[-1], shared))
                for i in range(0, len(tails), mb):
                    batches.append(tails[i:i + mb])
                    steps.append(last_token_step(batches[-1]))
                self.running.extend(group)
            for batch, logits in zip(batches, self.executor.forward_steps(cache, steps)):
                self._advance(batch, logits[:, 0])

    def _admit(self) -> list[_Sequence]:
        """Waiting prompts into the free rows, lowest rows first."""
        group = [self.waiting.popleft() for _ in range(min(len(self.free), len(self.waiting)))]
        self.free.sort()
        for s in group:
            s.slot = self.free.pop(0)
        return group

    def _finish(self, seq: _Sequence, reason: str, stop: str | None = None, text: str | None = None) -> None:
        self.running.remove(seq)
        self.free.append(seq.slot)
        ids = seq.generated
        if text is None:
            text = self.tokenizer.decode(ids[:-1] if reason == "eos" else ids)
        out = RequestOutput(seq.index, text, list(ids), reason, len(seq.prompt_ids),
                            seq.logprobs if seq.params.logprobs else None, stop, seq.sample,
                            seq.top_logprobs if seq.params.logprobs and seq.params.top_logprobs else None)
        self.results[self.result_index[seq.index, seq.sample]] = out
        if self.on_finish:
            self.on_finish(out)

    def _advance(self, batch: list[_Sequence], logits: torch.Tensor) -> None:
        want_lp = [i for i, s in enumerate(batch) if s.params.logprobs]
        # log-probabilities of the model's own distribution: taken before the grammar masks
        log_probs = torch.log_softmax(logits[want_lp], -1) if want_lp else None
        constrained = [i for i, s in enumerate(batch) if s.grammar is not None]
        mask_rows(logits, constrained, [batch[i].grammar for i in constrained])
        tokens = select_tokens(logits, [s.params for s in batch], [s.generator for s in batch])
        if want_lp:
            _record_logprobs([batch[i] for i in want_lp], log_probs, tokens[want_lp])
        for s, tok in zip(batch, tokens.tolist()):
            s.generated.append(tok)
            if s.grammar is not None:
                s.grammar.advance(tok)
        if self.on_tokens:
            self.on_tokens(len(batch))
        for s in batch:
            self._check_end(s)

    def _check_end(self, s: _Sequence) -> None:
        tok = s.generated[-1]
        if not s.params.ignore_eos and tok in self.tokenizer.eos_token_ids:
            return self._finish(s, "eos")
        if s.params.stop:
            hit = self.stop_checker.check(s)
            if hit is not None:
                return self._finish(s, "stop", stop=hit[0], text=hit[1])
        if len(s.generated) >= s.params.max_new_tokens or s.length >= self.capacity:
            return self._finish(s, "length")
        if s.grammar is not None and s.grammar.is_done:  # the value is complete: only an end token could follow
            self._finish(s, "eos", text=self.tokenizer.decode(s.generated))


def _record_logprobs(seqs: list[_Sequence], log_probs: torch.Tensor, tokens: torch.Tensor) -> None:
    """Each sequence's chosen token's log-probability and, where asked, the most likely tokens'."""
    chosen = log_probs.gather(-1, tokens[:, None])[:, 0].tolist()
    k = max(s.params.top_logprobs for s in seqs)
    values, ids = top_tokens(log_probs, k) if k else (None, None)
    for j, s in enumerate(seqs):
        s.logprobs.append(chosen[j])
        if s.params.top_logprobs:
            top = s.params.top_logprobs
            s.top_logprobs.append(list(zip(ids[j, :top].tolist(), values[j, :top].tolist())))


def _decode_step(batch: list[_Sequence]) -> Step:
    return Step(torch.tensor([[s.generated[-1]] for s in batch]), torch.tensor([[s.length - 1] for s in batch]),
                torch.tensor([s.slot for s in batch]), torch.zeros(len(batch), dtype=torch.long))


def _prefill_step(group: list[_Sequence], start: int = 0) -> Step:
    """Prefill of the prompts' tokens from position `start` on (before it: a shared prefix
    already copied into their cache rows). At least two columns (`placement.specs.prompt_columns`: a
    padded one where every prompt has one token left, as the planner charges it): a prompt's tokens
    are always fed as a prompt (`weight_kind.phase_of`), whatever its neighbours' lengths."""
    longest = prompt_columns(max(len(s.prompt_ids) for s in group) - start)
    ids = torch.zeros(len(group), longest, dtype=torch.long)
    for r, s in enumerate(group):
        ids[r, : len(s.prompt_ids) - start] = torch.tensor(s.prompt_ids[start:])
    pos = torch.arange(start, start + longest).expand(len(group), longest)
    lengths = torch.tensor([len(s.prompt_ids) - start for s in group])  # shorter rows are padded
    return Step(ids, pos, torch.tensor([s.slot for s in group]), lengths - 1, lengths=lengths)


# A shared prefix shorter than this is not worth a separate pass and the copies.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(prompts: Sequence[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (0 below
    MIN_SHARED_PREFIX: not worth a cache of its own)."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - 1
    shared = min(common_prefix_length(list(prompts)), n)
    return shared if shared >= MIN_SHARED_PREFIX else 0


class _StopChecker:
    """Finds stop strings in the decoded text, looking only at text that could hold a new match."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def check(self, seq: _Sequence) -> tuple[str, str] | None:
        text = self.tokenizer.decode(seq.generated)
        longest = max(len(s) for s in seq.params.stop)
        tail_from = max(0, len(text) - longest - 16)  # new token adds a few chars; stay generous
        best = None
        for stop in seq.params.stop:
            at = text.find(stop, tail_from)
            if at >= 0 and (best is None or at < best[1]):
                best = (stop, at)
        if best is None:
            return None
        return best[0], text[: best[1]]
