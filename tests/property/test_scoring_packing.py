"""Packed scoring rows (engine.batch.packing), checked against the plain sequences they stand for:
whatever the items and the row size, every scored token sees exactly its own sequence (root,
context, its continuation so far) at the rotary positions that sequence has alone, and every
continuation token is predicted once, in order, from the right place."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flexlamps.engine.batch.packing import Item, plan_rows, stack_rows

tokens = st.lists(st.integers(2, 99), min_size=1, max_size=9)


@st.composite
def layouts(draw):
    root_len = draw(st.integers(0, 4))
    items, pair = [], 0
    for _ in range(draw(st.integers(1, 7))):
        conts = draw(st.lists(tokens, min_size=1, max_size=4))
        items.append(Item(tuple(draw(tokens)), tuple(map(tuple, conts)), tuple(range(pair, pair + len(conts)))))
        pair += len(conts)
    return root_len, items, draw(st.integers(1, 40))


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_every_token_sees_exactly_its_own_sequence(layout):
    root_len, items, row_tokens = layout
    rows = plan_rows(items, root_len, row_tokens)
    placed = sorted(it.pair_ids for r in rows for it in r.items)
    assert placed == sorted(it.pair_ids for it in items)  # each item in exactly one row
    for r in rows:
        assert r.num_tokens <= row_tokens or len(r.items) == 1
    root = [("root", k) for k in range(root_len)]  # what the shared prefix's cache positions hold
    arr = stack_rows(rows)
    sees = _visible_cache_positions(arr["segments"])
    for n, row in enumerate(rows):  # every real token attends in exactly one segment, padding in none
        assert sorted(t for (r, t) in sees if r == n) == list(range(row.num_tokens))
    by_pair = {p: (it.context, c) for it in items for p, c in zip(it.pair_ids, it.continuations)}
    seen_targets = {}
    for n, row in enumerate(rows):
        keys = root + list(zip(arr["ids"][n].tolist(), arr["positions"][n].tolist()))  # cache position -> key
        for k, (t, pair, target) in enumerate(row.logit_targets()):
            ctx, cont = by_pair[pair]
            assert arr["logit_index"][n, k] == t
            seen_targets.setdefault(pair, []).append(target)
            # the query's keys, in the order its attention reads them, are its plain sequence up to itself
            plain = list(ctx) + list(cont[:-1])
            upto = len(ctx) + len(seen_targets[pair]) - 1  # tokens of the plain sequence fed so far
            assert [keys[s] for s in sees[n, t]] == root + list(zip(plain[:upto], range(root_len, root_len + upto)))
    assert seen_targets == {p: list(c) for p, (_, c) in by_pair.items()}
    assert arr["segments"].span == root_len + arr["ids"].shape[1]


def _visible_cache_positions(segments) -> dict[tuple[int, int], list[int]]:
    """(row, token index) -> the cache positions its attention reads, in order."""
    out = {}
    for g in segments.groups:
        for s in range(len(g.rows)):
            for i in range(g.queries.shape[1]):
                if g.query_valid[s, i]:
                    key = (int(g.rows[s]), int(g.queries[s, i]))
                    assert key not in out
                    out[key] = g.keys[s][g.mask[s, i]].tolist()
    return out
