"""Log-likelihood of continuations given contexts, with shared-prefix reuse.

Requests that share a token prefix (the instructions and in-context examples of an
evaluation, or one question's context under each of its choices) have that prefix computed
once; its KV rows are copied into each request's cache row and only the rest is run.
Levels: the prefix common to the whole call, then each distinct context, then the
continuations, batched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flexlamps.engine.batch.prefix import common_prefix_length, prefill_prefix
from flexlamps.engine.executors.step import Step


@dataclass
class ScoreOutput:
    logprob: float  # sum of the continuation tokens' log-probabilities
    num_tokens: int
    is_greedy: bool  # every continuation token was the argmax
    token_logprobs: list[float] = field(default_factory=list)


@dataclass
class PrefixStats:
    prefill_tokens_requested: int = 0
    prefill_tokens_computed: int = 0

    @property
    def reuse_factor(self) -> float:
        return self.prefill_tokens_requested / max(1, self.prefill_tokens_computed)


def split_tokens(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation ids the way lm-eval splits them: trailing context spaces move to
    the continuation, the whole is encoded once, and the context's ids are its prefix."""
    stripped = context.rstrip(" ")
    continuation = context[len(stripped):] + continuation
    ctx = tokenizer.encode(stripped) if stripped else []
    if not ctx and tokenizer.bos_token_id is not None:
        ctx = [tokenizer.bos_token_id]
    whole = tokenizer.encode(stripped + continuation) if stripped else ctx + tokenizer.encode(continuation, False)
    if whole[: len(ctx)] != ctx:  # the tokenizer merged across the boundary: encode separately
        whole = ctx + tokenizer.encode(continuation, add_special_tokens=False)
    return ctx, whole[len(ctx):]


class PrefixScorer:
    def __init__(self, executor, max_batch: int = 32, reuse_prefix: bool = True, stats: PrefixStats | None = None):
        self.ex = executor
        self.max_batch = max_batch
        self.reuse_prefix = reuse_prefix
        self.stats = stats if stats is not None else PrefixStats()

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[ScoreOutput]:
        if not pairs:
            return []
        for i, (ctx, cont) in enumerate(pairs):
            if not ctx or not cont:
                raise ValueError(f"score request {i} needs a non-empty context and continuation")
        self.stats.prefill_tokens_requested += sum(len(c) + len(k) for c, k in pairs)
        if not self.reuse_prefix:
            return self._run_leaves([], None, [(c + k, len(c)) for c, k in pairs])
        contexts = [c for c, _ in pairs]
        common = common_prefix_length(contexts) if len(pairs) > 1 else 0
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, c in enumerate(contexts):
            by_context.setdefault(tuple(c), []).append(i)
        results: list[ScoreOutput | None] = [None] * len(pairs)
        root = self._extend(None, [], contexts[0][:common]) if common else None
        # contexts seen once are batched together as leaves; repeated contexts get their own prefix
        singles = [ids[0] for ids in by_context.values() if len(ids) == 1]
        for ctx, ids in by_context.items():
            if len(ids) == 1:
                continue
            node = self._extend(root, list(ctx[:common]), list(ctx[common:])) if len(ctx) > common else root
            base = list(ctx)
            leaves = [(list(pairs[i][1]), 0) for i in ids]
            for i, out in zip(ids, self._run_leaves(base, node, leaves)):
                results[i] = out
            if node is not root:
                node.cache.free()
        if singles:
            base = contexts[0][:common]
            leaves = [(pairs[i][0][common:] + pairs[i][1], len(pairs[i][0]) - common) for i in singles]
            for i, out in zip(singles, self._run_leaves(base, root, leaves)):
                results[i] = out
        if root is not None:
            root.cache.free()
        return results  # type: ignore[return-value]

    def _extend(self, parent, parent_ids: list[int], new_ids: list[int]) -> "_Prefix":
        """A one-row cache holding parent_ids + new_ids, computing only new_ids."""
        cache, logits = prefill_prefix(self.ex, new_ids, parent.cache if parent else None, len(parent_ids))
        self.stats.prefill_tokens_computed += len(new_ids)
        return _Prefix(cache, torch.log_softmax(logits, -1))

    def _run_leaves(self, base: list[int], prefix: "_Prefix | None",
                    leaves: list[tuple[list[int], int]]) -> list[ScoreOutput]:
        """Score leaves after a cached prefix `base`. A leaf is (tokens after base, how many of
        them are still context); the rest is the continuation."""
        outs = []
        for start in range(0, len(leaves), self.max_batch):
            outs += self._leaf_batch(base, prefix, leaves[start:start + self.max_batch])
        return outs

    def _leaf_batch(self, base, prefix, leaves) -> list[ScoreOutput]:
        plen = len(base)
        n = len(leaves)
        width = max(len(toks) for toks, _ in leaves)
        cache = self.ex.new_cache(n, plen + width)
        if prefix is not None:
            cache.copy_prefix_from(prefix.cache, plen, torch.arange(n))
        ids = torch.zeros(n, width, dtype=torch.long)
        for r, (toks, _) in enumerate(leaves):
            ids[r, : len(toks)] = torch.tensor(toks)
        pos = torch.arange(plen, plen + width).expand(n, width)
        logp = torch.log_softmax(self.ex.forward_steps(cache, [Step(ids, pos, torch.arange(n))])[0], -1)
        cache.free()
        self.stats.prefill_tokens_computed += sum(len(toks) for toks, _ in leaves)
        outs = []
        for r, (toks, n_ctx) in enumerate(leaves):
            targets = torch.tensor(toks[n_ctx:])
            # token j of the leaf is predicted by position j - 1, or by the prefix's last position
            pred = logp[r, max(n_ctx - 1, 0): len(toks) - 1]
            if n_ctx == 0:
                pred = torch.cat([prefix.last_logprobs[None], pred])
            tok_lp = pred.gather(-1, targets[:, None])[:, 0]
            greedy = bool((pred.argmax(-1) == targets).all())
            outs.append(ScoreOutput(float(tok_lp.sum()), len(targets), greedy, tok_lp.tolist()))
        return outs


@dataclass
class _Prefix:
    cache: DenseKVCache
    last_logprobs: torch.Tensor  # log-probs predicted after the prefix's last token
