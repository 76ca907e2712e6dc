"""Log-likelihood of continuations given contexts, with shared-prefix reuse.

Requests that share a token prefix (the instructions and in-context examples of an
evaluation, or one question's context under each of its choices) have that prefix computed
once; its KV rows are copied into each request's cache row and only the rest is run.
Levels: the prefix common to the whole call, then the distinct contexts packed many to a
forward step, then their continuations packed the same way (see PrefixScorer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flexlamps.engine.batch.packing import Item, PackedRow, plan_rows, stack_rows
from flexlamps.engine.batch.sampling import check_finite
from flexlamps.engine.batch.prefix import common_prefix_length, prefill_prefix
from flexlamps.engine.executors.contract import Executor, KVCache
from flexlamps.engine.executors.step import Step


@dataclass
class ScoreOutput:
    logprob: float  # sum of the continuation tokens' log-probabilities
    num_tokens: int
    is_greedy: bool  # every continuation token was the argmax
    token_logprobs: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ScoreLimits:
    """What an offloaded plan holds (its dry run charged it), which the scorer stays within: at
    most `rows` cache rows a call (in steps of the scorer's `micro_batch`), `positions` cache
    positions a row (root included), logits at up to `logits` positions of a row, and a one-row
    root cache of up to `prefix` positions beside the block (a longer root takes one of the
    block's rows)."""
    rows: int
    positions: int
    prefix: int
    logits: int


@dataclass
class PrefixStats:
    prefill_tokens_requested: int = 0
    prefill_tokens_computed: int = 0


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


def root_length(contexts: list[list[int]]) -> int:
    """Tokens of the root a call's contexts share; every context keeps at least its last token out
    of it: its step gives the logits that predict the continuation's first token."""
    return min(common_prefix_length(contexts), min(map(len, contexts)) - 1) if len(contexts) > 1 else 0


def planning_positions(pairs: list[tuple[list[int], list[int]]], reuse_prefix: bool = True) -> tuple[int, int, int]:
    """(cache positions a row of the scorer's own layout holds, root included; the root's
    length; the fewest positions a row may hold): what an offloaded engine is planned for
    (`ScoreLimits`). A pair feeds its context and all but its continuation's last token."""
    fewest = max(len(c) + len(k) - 1 for c, k in pairs)
    if not reuse_prefix:
        return fewest, 0, fewest
    common = root_length([c for c, _ in pairs])
    by_context: dict[tuple[int, ...], list[int]] = {}
    for i, (c, _) in enumerate(pairs):
        by_context.setdefault(tuple(c), []).append(i)
    items = [Item(ctx[common:], tuple(tuple(pairs[i][1]) for i in ids), tuple(ids)) for ctx, ids in by_context.items()]
    widest = max(row.num_tokens for row in plan_rows(items, common, ROW_TOKENS))
    return max(fewest, common + widest), common, fewest


# Tokens per packed row (several questions each; see engine.batch.packing): attention in a row
# spans the whole row, so its cost per token grows with it; a few hundred keeps it small.
ROW_TOKENS = 128

# A step's rows are padded to its longest; a row shorter than this share of it starts a new step
# once the step has MIN_STEP_TOKENS (smaller GEMMs lose more to overhead than padding costs).
PAD_RATIO = 0.95
MIN_STEP_TOKENS = 32


class PrefixScorer:
    """Scores (context ids, continuation ids) pairs.

    With `reuse_prefix` (the default) the prefix common to the whole call is computed once, then
    the distinct contexts are packed many to a forward step (one row each), and their
    continuations follow in "rounds" over the same rows: round j feeds each row its j-th
    continuation at the positions right after the row's context. A round overwrites the cache
    positions the round before it wrote, and attention at position p only sees positions <= p,
    so every continuation sees exactly its own context. The context step and all rounds of a
    chunk of contexts go to the executor in one `forward_steps` call (one weight sweep when
    offloaded), in order, in steps of at most `micro_batch` rows and `step_tokens` padded tokens,
    rows of similar lengths together.
    """

    def __init__(self, executor: Executor, max_batch: int = 32, reuse_prefix: bool = True,
                 stats: PrefixStats | None = None,
                 micro_batch: int | None = None, max_logit_positions: int = 2048, step_tokens: int = 1024,
                 row_tokens: int | None = ROW_TOKENS, limits: ScoreLimits | None = None):
        self.ex = executor
        self.limits = limits  # an offloaded plan's geometry; None: in memory, no plan to keep to
        self.row_tokens = row_tokens  # packed rows (see engine.batch.packing); None: one context per row
        self._flags: dict[str, bool] = {}  # the executor's cache kind (`_cache_kind`)
        self.max_batch = max_batch
        self.micro_batch = micro_batch or max_batch
        self.step_tokens = step_tokens  # padded tokens per step: rows of similar length share one
        self.max_logit_positions = max_logit_positions  # continuation positions whose logits a chunk holds
        self.reuse_prefix = reuse_prefix
        self.stats = stats if stats is not None else PrefixStats()

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[ScoreOutput]:
        if not pairs:
            return []
        for i, (ctx, cont) in enumerate(pairs):
            if not ctx or not cont:
                raise ValueError(f"score request {i} needs a non-empty context and continuation")
        self.stats.prefill_tokens_requested += sum(len(c) + len(k) for c, k in pairs)
        rewinds, packs = self._cache_kind("rewinds"), self._can_pack()  # probed before any cache is held
        if not self.reuse_prefix:
            self._check_limits(pairs, 0)
            return self._run_leaves([], None, [(c + k, len(c)) for c, k in pairs])
        contexts = [c for c, _ in pairs]
        common = root_length(contexts)
        if self.limits is not None and common > self.limits.prefix and self.limits.rows == 1:
            common = 0  # an unplanned root takes one of the block's rows: a block of one has none to give
        self._check_limits(pairs, common)
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, c in enumerate(contexts):
            by_context.setdefault(tuple(c), []).append(i)
        root = self._extend(None, [], contexts[0][:common]) if common else None
        if not rewinds:  # no rounds over a row: each pair in a row of its own
            leaves = self._run_leaves(contexts[0][:common], root, [(c[common:] + k, len(c) - common) for c, k in pairs])
            if root is not None:
                root.cache.release()
            return leaves
        results: list[ScoreOutput | None] = [None] * len(pairs)
        groups = sorted(self._fit_groups(by_context, pairs, common), key=lambda kv: -len(kv[0]))
        if packs:
            items = [Item(ctx[common:], tuple(tuple(pairs[i][1]) for i in ids), tuple(ids)) for ctx, ids in groups]
            scored = self._score_packed(common, root, items)
        else:
            scored = (out for chunk in self._chunks(groups, pairs, common)
                      for out in self._score_chunk(common, root, chunk, pairs))
        for i, out in scored:
            results[i] = out
        if root is not None:
            root.cache.release()
        return results  # type: ignore[return-value]

    def _check_limits(self, pairs, common: int) -> None:
        """Every pair fits the plan's rows after a root of `common`: its context and continuation
        but the last token within the positions, what it feeds within the logits a row returns."""
        if self.limits is None:
            return
        width = self._row_room(common)[0]
        for i, (ctx, cont) in enumerate(pairs):
            if len(ctx) + len(cont) - 1 - common <= width:
                continue
            if self.limits.logits == 1:
                raise ValueError("this LLM's offloaded engine was planned for generation (one logit position "
                                 "a row); plan it for scoring: LLM.prepare(..., scoring=True), or a fresh LLM")
            raise ValueError(f"score request {i} has {len(ctx) + len(cont)} tokens; the offloaded engine was planned "
                             f"for {common + width + 1}: plan for the longest (LLM.prepare(prompt_len=..., "
                             "scoring=True)) or use a fresh LLM")

    def _row_room(self, common: int) -> tuple[int, int]:
        """(tokens a row feeds after a root of `common`, cache rows a call) within the plan's limits."""
        lim = self.limits
        return min(lim.positions - common, lim.logits), lim.rows - (1 if common > lim.prefix else 0)

    def _fit_groups(self, by_context: dict, pairs, common: int) -> list[tuple[tuple[int, ...], list[int]]]:
        """(context, pair ids) groups; within a plan's limits a context whose continuations do not
        fit one row together is split into groups that do (the context fed once per group)."""
        if self.limits is None:
            return list(by_context.items())
        width, _ = self._row_room(common)
        out = []
        for ctx, ids in by_context.items():
            group, used = [], len(ctx) - common
            for i in ids:
                fed = len(pairs[i][1]) - 1
                if group and used + fed > width:
                    out.append((ctx, group))
                    group, used = [], len(ctx) - common
                group.append(i)
                used += fed
            out.append((ctx, group))
        return out

    def _can_pack(self) -> bool:
        """Whether this executor's caches take packed rows (the dense and tiered KV caches do)."""
        return self.row_tokens is not None and self._cache_kind("packs_rows")

    def _cache_kind(self, flag: str) -> bool:
        """A flag of this executor's caches (the contract's `KVCache.packs_rows` or `rewinds`: a row
        fed again from an earlier position, as rounds of continuations are)."""
        if flag not in self._flags:
            probe = self.ex.new_cache(1, 1)
            self._flags[flag] = bool(getattr(probe, flag))
            probe.release()
        return self._flags[flag]

    def _score_packed(self, common: int, root, items: list[Item]):
        """Items packed into rows (see engine.batch.packing); the rows go to the executor in
        chunks holding no more cache positions than `max_batch` unpacked questions would (the
        memory an offloaded policy was planned for), in steps of at most `step_tokens` tokens."""
        row_tokens, max_rows = self.row_tokens, None
        if self.limits is not None:  # rows as wide and as many as the plan holds
            row_tokens, max_rows = self._row_room(common)
        rows = sorted(plan_rows(items, common, row_tokens), key=lambda r: -r.num_tokens)
        longest = max(it.num_tokens for it in items)
        width = rows[0].num_tokens
        rows_per_step = max(1, min(self.step_tokens, self.micro_batch * longest) // width)
        rows_per_chunk = max(rows_per_step, self.max_batch * (common + longest) // (common + width))
        if max_rows is not None:
            rows_per_step, rows_per_chunk = min(rows_per_step, max_rows), min(rows_per_chunk, max_rows)
        start = 0
        while start < len(rows):
            chunk, logits = [], 0
            for row in rows[start:start + rows_per_chunk]:
                if chunk and logits + row.num_logits > self.max_logit_positions:
                    break
                chunk.append(row)
                logits += row.num_logits
            start += len(chunk)
            yield from self._run_packed(common, root, chunk, rows_per_step)

    def _run_packed(self, common: int, root, rows: list[PackedRow], rows_per_step: int):
        """One forward_steps call over these rows; yields (pair id, ScoreOutput)."""
        cache = self.ex.new_cache(len(rows), common + rows[0].num_tokens)
        if root is not None:
            cache.copy_prefix_from(root.cache, common, torch.arange(len(rows)))
        parts = [list(range(k, min(len(rows), k + rows_per_step))) for k in range(0, len(rows), rows_per_step)]
        steps = []
        for part in parts:
            arr = stack_rows([rows[r] for r in part])
            steps.append(Step(arr["ids"], arr["positions"], torch.tensor(part), logit_rows=arr["logit_index"],
                              cache_positions=arr["cache_positions"], segments=arr["segments"]))
        outs = self.ex.forward_steps(cache, steps)
        cache.release()
        self.stats.prefill_tokens_computed += sum(r.num_tokens for r in rows)
        per_pair: dict[int, list[tuple[float, bool]]] = {}
        for part, logits in zip(parts, outs):
            logp = torch.log_softmax(logits, -1)  # (rows, K, V)
            for k, r in enumerate(part):
                targets = rows[r].logit_targets()
                wanted = torch.tensor([tok for _, _, tok in targets])
                lp = logp[k, : len(targets)].gather(-1, wanted[:, None])[:, 0]
                best = logp[k, : len(targets)].argmax(-1) == wanted
                for kk, (_, pair, _) in enumerate(targets):
                    per_pair.setdefault(pair, []).append((lp[kk], bool(best[kk])))
        for pair, toks in per_pair.items():
            tok_lp = torch.stack([lp for lp, _ in toks])
            check_finite(tok_lp)
            yield pair, ScoreOutput(float(tok_lp.sum()), len(toks), all(g for _, g in toks), tok_lp.tolist())

    def _chunks(self, groups, pairs, common: int):
        """Consecutive groups (context, pair indices; longest context first) while the rows fit
        `max_batch` and the rounds' logit positions (padded per round) fit `max_logit_positions`;
        within a plan's limits also while a row's positions (the longest context and continuation)
        and the call's padded tokens fit what the plan holds."""
        chunk, rounds = [], []
        width, max_rows = self._row_room(common) if self.limits is not None else (None, self.max_batch)
        for ctx, ids in groups:
            fed = sorted((len(pairs[i][1]) - 1 for i in ids), reverse=True)
            merged = _add_rows(rounds, fed)
            padded = sum(t * n for t, n in merged)
            over = len(chunk) >= max_rows or padded > self.max_logit_positions
            if width is not None and chunk:
                first = len(chunk[0][0]) - common
                over = over or first + merged[0][0] > width or (len(chunk) + 1) * first + padded > max_rows * width
            if chunk and over:
                yield chunk
                chunk, merged = [], _add_rows([], fed)
            chunk.append((ctx, ids))
            rounds = merged
        if chunk:
            yield chunk

    def _score_chunk(self, common: int, root, chunk, pairs):
        """One forward_steps call: the chunk's contexts (after the root), then its rounds."""
        rests = [list(ctx[common:]) for ctx, _ in chunk]
        # round j takes each row's j-th longest continuation, so a round's rows have similar lengths
        leaves = [sorted(ids, key=lambda i: -len(pairs[i][1])) for _, ids in chunk]
        width = max(map(len, rests))
        longest = max(len(pairs[ids[0]][1]) for ids in leaves)
        cache = self.ex.new_cache(len(chunk), common + width + longest)
        rows = torch.arange(len(chunk))
        if root is not None:
            cache.copy_prefix_from(root.cache, common, rows)
        steps = []
        for part in self._split(list(range(len(chunk))), lambda r: len(rests[r])):  # rows come longest first
            steps.append(self._step([rests[r] for r in part], [common] * len(part), rows[part], last_only=True))
        num_ctx_steps = len(steps)
        members = []  # per round step: the pair indices of its rows
        for j in range(max(map(len, leaves))):
            fed = [(r, ids[j]) for r, ids in enumerate(leaves) if j < len(ids) and len(pairs[ids[j]][1]) > 1]
            fed.sort(key=lambda m: -len(pairs[m[1]][1]))
            for part in self._split(fed, lambda m: len(pairs[m[1]][1]) - 1):
                members.append([i for _, i in part])
                steps.append(self._step([pairs[i][1][:-1] for _, i in part], [common + len(rests[r]) for r, _ in part],
                                        torch.tensor([r for r, _ in part]), last_only=False))
        outs = self.ex.forward_steps(cache, steps)
        cache.release()
        self.stats.prefill_tokens_computed += sum(map(len, rests)) + sum(
            len(pairs[i][1]) - 1 for part in members for i in part)
        first = torch.log_softmax(torch.cat([o[:, 0] for o in outs[:num_ctx_steps]]), -1)  # (rows, V)
        later: dict[int, torch.Tensor] = {}  # pair index -> log-probs predicting tokens 1.. of its continuation
        for part, logits in zip(members, outs[num_ctx_steps:]):
            for k, i in enumerate(part):
                later[i] = torch.log_softmax(logits[k, : len(pairs[i][1]) - 1], -1)
        for r, ids in enumerate(leaves):
            for i in ids:
                pred = first[r][None] if i not in later else torch.cat([first[r][None], later[i]])
                yield i, _score_output(pred, pairs[i][1])

    def _split(self, items: list, length) -> list[list]:
        """Consecutive parts of `items` (longest first), each padded to its first (longest) row: at
        most `micro_batch` rows and `step_tokens` tokens, and a new part once a row is shorter than
        PAD_RATIO of the first and the part is big enough to keep the GEMMs efficient."""
        parts: list[list] = []
        for item in items:
            n = max(1, length(item))
            if parts:
                part = parts[-1]
                first = max(1, length(part[0]))
                fits = len(part) < self.micro_batch and (len(part) + 1) * first <= self.step_tokens
                wasteful = n < PAD_RATIO * first and len(part) * first >= MIN_STEP_TOKENS
                if fits and not wasteful:
                    part.append(item)
                    continue
            parts.append([item])
        return parts

    def _step(self, seqs: list[list[int]], starts: list[int], rows: torch.Tensor, last_only: bool) -> Step:
        """Row k feeds seqs[k] at positions starts[k].. (padded to the longest; padding only writes
        positions no real token attends to); `last_only` returns each row's last logits only."""
        width = max(map(len, seqs))
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for k, toks in enumerate(seqs):
            ids[k, : len(toks)] = torch.tensor(toks)
        pos = torch.tensor(starts)[:, None] + torch.arange(width)[None]
        lengths = torch.tensor([len(t) for t in seqs])
        return Step(ids, pos, rows, logit_rows=lengths - 1 if last_only else None, lengths=lengths)

    def _extend(self, parent, parent_ids: list[int], new_ids: list[int]) -> "_Prefix":
        """A one-row cache holding parent_ids + new_ids, computing only new_ids."""
        cache, logits = prefill_prefix(self.ex, new_ids, parent.cache if parent else None, len(parent_ids))
        self.stats.prefill_tokens_computed += len(new_ids)
        return _Prefix(cache, torch.log_softmax(logits, -1))

    def _run_leaves(self, base: list[int], prefix: "_Prefix | None",
                    leaves: list[tuple[list[int], int]]) -> list[ScoreOutput]:
        """Score leaves after a cached prefix `base`. A leaf is (tokens after base, how many of
        them are still context); the rest is the continuation."""
        rows = self.max_batch
        if self.limits is not None:
            rows = self._row_room(len(base))[1] if prefix is not None else self.limits.rows
        outs = []
        for start in range(0, len(leaves), rows):
            outs += self._leaf_batch(base, prefix, leaves[start:start + rows])
        return outs

    def _leaf_batch(self, base, prefix, leaves) -> list[ScoreOutput]:
        """One forward_steps call over these leaves, in steps of `micro_batch` rows; a leaf's last
        token is not fed (it is only predicted)."""
        plen = len(base)
        n = len(leaves)
        width = max(len(toks) for toks, _ in leaves) - 1
        cache = self.ex.new_cache(n, plen + width)
        if prefix is not None:
            cache.copy_prefix_from(prefix.cache, plen, torch.arange(n))
        ids = torch.zeros(n, width, dtype=torch.long)
        for r, (toks, _) in enumerate(leaves):
            ids[r, : len(toks) - 1] = torch.tensor(toks[:-1])
        pos = torch.arange(plen, plen + width).expand(n, width)
        parts = [torch.arange(k, min(n, k + self.micro_batch)) for k in range(0, n, self.micro_batch)]
        outs = self.ex.forward_steps(cache, [Step(ids[p], pos[p], p) for p in parts])
        logp = torch.log_softmax(torch.cat(outs), -1)
        cache.release()
        self.stats.prefill_tokens_computed += sum(len(toks) - 1 for toks, _ in leaves)
        outs = []
        for r, (toks, n_ctx) in enumerate(leaves):
            # token j of the leaf is predicted by position j - 1, or by the prefix's last position
            pred = logp[r, max(n_ctx - 1, 0): len(toks) - 1]
            if n_ctx == 0:
                pred = torch.cat([prefix.last_logprobs[None], pred])
            outs.append(_score_output(pred, toks[n_ctx:]))
        return outs


def _add_rows(rounds: list[tuple[int, int]], fed: list[int]) -> list[tuple[int, int]]:
    """(longest fed length, rows) per round after a row joins with continuations fed `fed` long."""
    out = list(rounds) + [(0, 0)] * (len(fed) - len(rounds))
    for j, f in enumerate(fed):
        out[j] = (max(out[j][0], f), out[j][1] + 1)
    return out


def _score_output(pred: torch.Tensor, targets: list[int]) -> ScoreOutput:
    """pred: (len(targets), V) log-probs, row t predicting targets[t]."""
    target = torch.tensor(targets)
    tok_lp = pred.gather(-1, target[:, None])[:, 0]
    check_finite(tok_lp)
    greedy = bool((pred.argmax(-1) == target).all())
    return ScoreOutput(float(tok_lp.sum()), len(targets), greedy, tok_lp.tolist())


@dataclass
class _Prefix:
    cache: KVCache
    last_logprobs: torch.Tensor  # log-probs predicted after the prefix's last token
