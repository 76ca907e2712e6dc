"""Packed scoring: many questions' contexts and continuations in each cache row of one forward.

A row holds several independent items one after another, each item a context followed by its
choices' continuations (all but their last token, which is only predicted). Every token carries
its own rotary position (its place in its own sequence) apart from the cache position it is
written at, and it attends only to its own sequence (HF's "packed sequences", FlashAttention's
varlen): the shared root prefix, its item's context and the earlier tokens of its own segment:

    cache row:  [ root | ctx A | A.choice0 | A.choice1 | ctx B | B.choice0 | ... | padding ]
    A.choice1 sees   root + ctx A + A.choice1 (causally), never A.choice0 or B.

So a question's choices all run in the same step as their context: no padding between rows of
unequal length, no short rounds of continuations. `plan_rows` is the layout (plain data);
`stack_rows` turns rows into a Step's arrays, and `segments_of` into the attention each segment
(a context, or one choice's fed tokens) runs over its own keys (see engine.caches.segments).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flexlamps.engine.executors.step import SegmentGroup, Segments


@dataclass(frozen=True, slots=True)
class Item:
    """One distinct context (its tokens after the root) and the continuations scored after it."""
    context: tuple[int, ...]
    continuations: tuple[tuple[int, ...], ...]
    pair_ids: tuple[int, ...]  # which scored pair each continuation is

    @property
    def num_tokens(self) -> int:
        """Tokens it feeds: its context and every continuation but the continuation's last token."""
        return len(self.context) + sum(len(c) - 1 for c in self.continuations)

    @property
    def num_logits(self) -> int:
        """Positions whose logits it needs: the context's last and every fed continuation token."""
        return 1 + sum(len(c) - 1 for c in self.continuations)


@dataclass
class PackedRow:
    """Items laid end to end after a root of `root_len` cache positions."""
    root_len: int
    items: list[Item] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(it.num_tokens for it in self.items)

    @property
    def num_logits(self) -> int:
        return sum(it.num_logits for it in self.items)

    def segments(self) -> list[tuple[int, int, list[int]]]:
        """(first token index in the row, tokens, keys) per segment: a context (seeing the root
        and itself) or one choice's fed tokens (the root, its context, itself); keys are cache
        positions in the segment's sequence order, the segment's own tokens last."""
        out, t = [], 0
        root = list(range(self.root_len))
        for it in self.items:
            ctx = list(range(self.root_len + t, self.root_len + t + len(it.context)))
            out.append((t, len(it.context), root + ctx))
            t += len(it.context)
            for cont in it.continuations:
                fed = len(cont) - 1
                if fed:
                    out.append((t, fed, root + ctx + list(range(self.root_len + t, self.root_len + t + fed))))
                t += fed
        return out

    def tensors(self, width: int) -> dict[str, torch.Tensor]:
        """The row's ids and rotary positions, padded to `width` tokens (index t is cache
        position root_len + t): a context from position root_len, a choice after its context."""
        ids, pos = [], []
        for it in self.items:
            ids += it.context
            pos += range(self.root_len, self.root_len + len(it.context))
            for cont in it.continuations:
                ids += cont[:-1]
                pos += range(self.root_len + len(it.context), self.root_len + len(it.context) + len(cont) - 1)
        pad = width - len(ids)
        return {"ids": torch.tensor(ids + [0] * pad, dtype=torch.long),
                "positions": torch.tensor(pos + [0] * pad, dtype=torch.long),
                "cache_positions": torch.arange(self.root_len, self.root_len + width)}

    def logit_targets(self) -> list[tuple[int, int, int]]:
        """(token index in the row, pair id, the token it must predict) for every logit the row
        needs, each pair's in order; the context's last token predicts token 0 of each of its
        item's continuations."""
        out, t = [], 0
        for it in self.items:
            last = t + len(it.context) - 1
            t += len(it.context)
            for pair, cont in zip(it.pair_ids, it.continuations):
                out.append((last, pair, cont[0]))
                out += [(t + j - 1, pair, cont[j]) for j in range(1, len(cont))]
                t += len(cont) - 1
        return out


def plan_rows(items: list[Item], root_len: int, row_tokens: int) -> list[PackedRow]:
    """First-fit decreasing: items longest first, each into the first row with room for it; an
    item longer than `row_tokens` gets a row of its own."""
    rows: list[PackedRow] = []
    room: list[int] = []
    for it in sorted(items, key=lambda i: -i.num_tokens):
        n = it.num_tokens
        slot = next((r for r, free in enumerate(room) if free >= n), None)
        if slot is None:
            rows.append(PackedRow(root_len))
            room.append(max(row_tokens, n))
            slot = len(rows) - 1
        rows[slot].items.append(it)
        room[slot] -= n
    return rows


def stack_rows(rows: list[PackedRow]) -> dict:
    """The rows' arrays stacked (n, T), T the longest row; `segments` (executors.step.Segments)
    and the logit indices (n, K) padded with index 0."""
    width = max(r.num_tokens for r in rows)
    per_row = [r.tensors(width) for r in rows]
    out: dict = {k: torch.stack([a[k] for a in per_row]) for k in per_row[0]}
    out["segments"] = segments_of(rows)
    targets = [r.logit_targets() for r in rows]
    k = max(len(t) for t in targets)
    out["logit_index"] = torch.tensor([[t for t, _, _ in ts] + [0] * (k - len(ts)) for ts in targets])
    return out


def segments_of(rows: list[PackedRow]) -> Segments:
    """The rows' segments, grouped by query count rounded up to a power of two (equal shapes
    per group: one attention call each, at most half of a group's queries padding)."""
    buckets: dict[int, list[tuple[int, int, int, list[int]]]] = {}
    for r, row in enumerate(rows):
        for first, count, keys in row.segments():
            buckets.setdefault(1 << (count - 1).bit_length(), []).append((r, first, count, keys))
    groups = []
    for q_max, segs in sorted(buckets.items()):
        k_max = max(len(keys) for *_, keys in segs)
        queries = torch.zeros(len(segs), q_max, dtype=torch.long)
        keys_at = torch.zeros(len(segs), k_max, dtype=torch.long)
        seen = torch.zeros(len(segs), q_max, dtype=torch.long)  # keys query i sees: 0..seen-1
        for g, (_, first, count, keys) in enumerate(segs):
            queries[g, :count] = torch.arange(first, first + count)
            keys_at[g, : len(keys)] = torch.tensor(keys)
            seen[g] = torch.arange(len(keys) - count + 1, len(keys) - count + 1 + q_max).clamp(max=len(keys))
        mask = torch.arange(k_max)[None, None, :] < seen[:, :, None]  # padded queries: every key, unused
        valid = torch.arange(q_max)[None, :] < torch.tensor([c for _, _, c, _ in segs])[:, None]
        groups.append(SegmentGroup(torch.tensor([r for r, *_ in segs]), queries, valid, keys_at, mask))
    root_len = rows[0].root_len
    return Segments(tuple(groups), root_len + max(r.num_tokens for r in rows), fresh_from=root_len)
