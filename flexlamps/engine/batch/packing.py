"""Packed scoring: many questions' contexts and continuations in each cache row of one forward.

A row holds several independent items one after another, each item a context followed by its
choices' continuations (all but their last token, which is only predicted). Every token carries
its own rotary position (its place in its own sequence) apart from the cache position it is
written at, and a block-diagonal mask (HF's "packed sequences", FlashAttention varlen) lets it
see only the shared root prefix, its item's context and the earlier tokens of its own segment:

    cache row:  [ root | ctx A | A.choice0 | A.choice1 | ctx B | B.choice0 | ... | padding ]
    A.choice1 sees   root + ctx A + A.choice1 (causally), never A.choice0 or B.

So a question's choices all run in the same step as their context: no padding between rows of
unequal length, no short rounds of continuations. `plan_rows` is the layout (plain data, no
torch); `PackedRow.tensors` turns one row into the Step's per-token arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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

    def tensors(self, width: int) -> dict[str, torch.Tensor]:
        """The row's per-token arrays, padded to `width` tokens (index t is cache position
        root_len + t): ids, positions (rotary), and the visible window as three bounds per token
        (see `visible_mask`)."""
        ids, pos, ctx_lo, ctx_hi, own_lo = ([] for _ in range(5))

        def feed(toks, first_position: int, context: tuple[int, int]) -> None:
            own_lo.extend([self.root_len + len(ids)] * len(toks))
            ids.extend(toks)
            pos.extend(range(first_position, first_position + len(toks)))
            ctx_lo.extend([context[0]] * len(toks))
            ctx_hi.extend([context[1]] * len(toks))

        for it in self.items:
            start = self.root_len + len(ids)
            feed(it.context, self.root_len, (start, start))  # a context sees the root and itself
            for cont in it.continuations:  # each choice: the root, its context, itself
                feed(cont[:-1], self.root_len + len(it.context), (start, start + len(it.context)))
        pad = width - len(ids)
        cache_pos = torch.arange(self.root_len, self.root_len + width)
        # padding sees only itself (never a real token's keys; no real token sees it)
        return {"ids": torch.tensor(ids + [0] * pad, dtype=torch.long),
                "positions": torch.tensor(pos + [0] * pad, dtype=torch.long),
                "ctx_lo": torch.tensor(ctx_lo + [0] * pad), "ctx_hi": torch.tensor(ctx_hi + [0] * pad),
                "own_lo": torch.cat([torch.tensor(own_lo, dtype=torch.long), cache_pos[len(own_lo):]]),
                "cache_positions": cache_pos}

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


def visible_mask(root_len: int, arrays: dict[str, torch.Tensor]) -> torch.Tensor:
    """(n, T, root_len + T) bool: token t sees the root, its item's context [ctx_lo, ctx_hi) and
    its own segment from own_lo up to its own cache position."""
    cache_pos = arrays["cache_positions"]  # (n, T)
    keys = torch.arange(root_len + cache_pos.shape[1])[None, None, :]
    own = (keys >= arrays["own_lo"][..., None]) & (keys <= cache_pos[..., None])
    ctx = (keys >= arrays["ctx_lo"][..., None]) & (keys < arrays["ctx_hi"][..., None])
    return own | ctx | (keys < root_len)


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


def stack_rows(rows: list[PackedRow]) -> dict[str, torch.Tensor]:
    """The rows' arrays stacked (n, T), T the longest row; plus `visible` (n, T, S) and the
    logit indices (n, K) padded with index 0."""
    width = max(r.num_tokens for r in rows)
    per_row = [r.tensors(width) for r in rows]
    out = {k: torch.stack([a[k] for a in per_row]) for k in per_row[0]}
    out["visible"] = visible_mask(rows[0].root_len, out)
    targets = [r.logit_targets() for r in rows]
    k = max(len(t) for t in targets)
    out["logit_index"] = torch.tensor([[t for t, _, _ in ts] + [0] * (k - len(ts)) for ts in targets])
    return out
