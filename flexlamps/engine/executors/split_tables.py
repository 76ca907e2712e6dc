"""Reading a table (embedding or output head) whose vocab rows are split across tiers.

An embedding lookup gathers each piece's rows from its tier; the output head is computed in
vocab chunks that never cross a piece, so each chunk is read from one tier and its logits are
written into their columns. The executor runs both; the dry run sizes the head's chunks with
the same `head_chunks`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from flexlamps.engine.executors.placement_map import RowPiece


def head_chunks(pieces: Sequence[RowPiece], chunk_rows: int) -> Iterator[tuple[RowPiece, int, int]]:
    """(piece, start, stop) of every vocab chunk of at most `chunk_rows` rows, in row order;
    start and stop are vocab rows (the piece's own rows are `start - piece.start` on)."""
    for piece in pieces:
        for start in range(piece.start, piece.stop, chunk_rows):
            yield piece, start, min(piece.stop, start + chunk_rows)


def gather_rows(store, pieces: Sequence[RowPiece], rows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Rows `rows` (sorted, unique vocab ids) of a split table on the compute device, and the
    bytes staged on the gpu tier (to hand back with `store.release`)."""
    if len(pieces) == 1:
        return store.gather_rows(pieces[0].name, rows)
    parts, staged = [], 0
    try:
        for piece in pieces:  # sorted ids: each piece's rows are one run of the output, in order
            mine = rows[(rows >= piece.start) & (rows < piece.stop)]
            if len(mine):
                part, nbytes = store.gather_rows(piece.name, mine - piece.start)
                parts.append(part)
                staged += nbytes
        return torch.cat(parts), staged
    except BaseException:
        store.release(staged)
        raise
