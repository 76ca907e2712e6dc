"""Reading a table (embedding or output head) whose vocab rows are split across tiers.

An embedding lookup gathers each piece's rows from its tier; the output head is computed in
vocab chunks that never cross a piece, so each chunk is read from one tier and its logits are
written into their columns, the next off-gpu chunk read meanwhile where there is room
(`HeadReads`). The executor runs both; the dry run sizes the head's chunks with the same
`head_chunks`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

import torch

from flexlamps.engine.executors.placement_map import RowPiece
from offload import BudgetExceededError


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


class HeadReads:
    """The output head's vocab chunks for one sweep, in order (`take(i)`: chunk i's weight and its
    staged bytes): each off-gpu chunk read while the one before is multiplied, where the gpu tier's
    use stays under `limit` with a second staged chunk (the sweep's charged peak, which the layers'
    staging sets: cached experts give way), else read in turn, so the read-ahead never takes a run
    past what its dry run charges. `limit`: a function giving it, called once, when a chunk could
    first be read ahead; None: the tier's capacity."""

    def __init__(self, store, budget, chunks, row_bytes: int, limit: Callable[[], int] | None = None):
        self.store, self.budget, self.chunks, self.row_bytes = store, budget, chunks, row_bytes
        self._limit_of, self._limit = limit, None
        self._ahead: tuple[int, Future] | None = None

    def _room_limit(self) -> int:
        if self._limit is None:
            asked = self._limit_of() if self._limit_of is not None else self.budget.capacity_bytes
            self._limit = min(asked, self.budget.capacity_bytes)
        return self._limit

    def _read(self, i: int):
        piece, start, stop = self.chunks[i]
        if not self.store.is_plain(piece.name):  # a piece kept as codes: its chunk is the whole piece
            fetched, staged = self.store.fetch([piece.name])
            return fetched[piece.name], staged
        return self.store.fetch_rows(piece.name, start - piece.start, stop - piece.start)

    def take(self, i: int):
        ahead, self._ahead = self._ahead, None
        try:
            got = ahead[1].result() if ahead is not None and ahead[0] == i else self._read(i)
        except BudgetExceededError:  # the room went meanwhile (a row estimate off): read it in turn
            got = self._read(i)
        nxt = i + 1
        if nxt < len(self.chunks) and self.chunks[nxt][0].tier != "gpu":
            piece, start, stop = self.chunks[nxt]
            if self.budget.used_bytes + (stop - start) * self.row_bytes <= self._room_limit():
                self._ahead = (nxt, self.store.submit(lambda: self._read(nxt)))
        return got

    def close(self) -> None:
        """Release a chunk read ahead and never taken (the sweep raised)."""
        if self._ahead is not None and self._ahead[1].exception() is None:
            self.store.release(self._ahead[1].result()[1])
        self._ahead = None
