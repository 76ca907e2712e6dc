"""`Step`: one micro-batch of one forward sweep, the unit every executor runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from placement.specs import prompt_columns


@dataclass
class Step:
    """Tokens (n, T) at positions (n, T) in cache rows `slots` (n,). `logit_rows` picks the
    indices along T whose logits are returned: (n,) one per row (the last real token), (n, K)
    K per row; None returns all.

    Packed rows (several independent sequences in one cache row, e.g. many questions scored in
    one forward): `cache_positions` (n, T) says where each token's keys and values go in its row
    when that is not its position (the position only sets the rotary phase), and `segments`
    which keys each token attends to (its own sequence's). None: a token is written at its
    position and sees the row's positions up to it. Only caches with `packs_rows = True` accept
    packed steps.

    `lengths` (n,): the real tokens of each row when rows are padded after them (a prefill group of
    prompts of unequal length); None: every token is real. Attention never reads the padding, but
    a recurrent state (caches.state) must stop at a row's last real token."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logit_rows: torch.Tensor | None = None
    cache_positions: torch.Tensor | None = None
    segments: "Segments | None" = None
    lengths: torch.Tensor | None = None

    @property
    def write_positions(self) -> torch.Tensor:
        """Where each token's keys and values go in its cache row (n, T)."""
        return self.positions if self.cache_positions is None else self.cache_positions

    @property
    def mask_kwargs(self) -> dict:
        """The packed-row mask for a cache's `attend_fn` / `step_geometry` ({} when causal)."""
        return {} if self.segments is None else {"segments": self.segments}

    @property
    def geometry_kwargs(self) -> dict:
        """A cache's `step_geometry` keywords: the packed-row mask and the rows' real lengths."""
        return self.mask_kwargs if self.lengths is None else {**self.mask_kwargs, "lengths": self.lengths}

    @property
    def span(self) -> int:
        """Cache positions its attention reads (0..span-1 of each row)."""
        return int(self.write_positions.max()) + 1 if self.segments is None else self.segments.span

    def pick_logit_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (n, T, h) -> those at `logit_rows`: (n, 1, h), (n, K, h), or all."""
        if self.logit_rows is None or (x.shape[1] == 1 and self.logit_rows.dim() == 1):
            return x  # one token per row (a decode step): its only index
        rows = self.logit_rows.to(x.device)
        index = torch.arange(x.shape[0], device=x.device)
        return x[index, rows][:, None] if rows.dim() == 1 else x[index[:, None], rows]


@dataclass(frozen=True)
class SegmentGroup:
    """Segments of one padded shape. A segment is a run of queries of one packed row that attends
    to its own sequence: the keys at `keys` (cache positions, in the sequence's order) with query
    i seeing keys 0..`mask`; gathered so they start at 0, as in a row of their own, its attention
    sums in the order an unpacked row's does."""
    rows: torch.Tensor  # (G,) the step row each segment is in
    queries: torch.Tensor  # (G, Q) indices along T of its queries (padding: 0, see query_valid)
    query_valid: torch.Tensor  # (G, Q) bool
    keys: torch.Tensor  # (G, K) cache positions of the keys it reads (padding: 0, masked)
    mask: torch.Tensor  # (G, Q, K) bool: query i sees key j

    def to(self, device) -> "SegmentGroup":
        return SegmentGroup(*(t.to(device) for t in (self.rows, self.queries, self.query_valid, self.keys,
                                                      self.mask)))


@dataclass(frozen=True)
class Segments:
    """Which keys each token of a packed step attends to, as groups of equally shaped segments."""
    groups: tuple[SegmentGroup, ...]
    span: int  # keys reach cache positions 0..span-1
    # cache positions fresh_from..span-1 hold this step's own tokens (written in order): their keys
    # are attended as computed, not read back (a compressed cache's prefill reads exact keys)
    fresh_from: int = 0

    def to(self, device) -> "Segments":
        return Segments(tuple(g.to(device) for g in self.groups), self.span, self.fresh_from)


def prompt_step(tokens: list[list[int]], starts: list[int], slots: torch.Tensor, device=None) -> Step:
    """Rows of tokens fed as a prompt (`weight_kind.Phase.PROMPT`), row r from position starts[r]
    on: at least `prompt_columns` wide, so a one-token chunk (a prompt, an API call's returned
    token, a recompute chunk) is computed as prompt tokens are, not as a decode; shorter rows
    padded with token 0 after their own, which no cache writes (`lengths`). Logits at each row's
    last real token."""
    width = prompt_columns(max(len(t) for t in tokens))
    ids = torch.zeros(len(tokens), width, dtype=torch.long)
    for row, row_tokens in enumerate(tokens):
        ids[row, :len(row_tokens)] = torch.tensor(row_tokens)
    positions = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]  # (n, width)
    lengths = torch.tensor([len(t) for t in tokens])
    padded = bool((lengths < width).any())
    return Step(ids.to(device), positions.to(device), slots, (lengths - 1).to(device),
                lengths=lengths.to(device) if padded else None)
