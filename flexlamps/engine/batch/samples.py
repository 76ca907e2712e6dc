"""Several samples of one prompt (`SamplingParams.n > 1`) share its prefill: the prompt's cache
up to its last token is computed once into a one-row cache, copied into each sample's row, and
each sample then runs only the last prompt token (as a prompt: a padded two-column step, so it
takes the arithmetic it takes when the prompt is prefilled whole, `weight_kind.phase_of`). Every
sample of such a prompt takes this path, wherever its rows and batches fall, so sample k's
tokens do not depend on which sample was admitted first or on the batch around it.
"""

from __future__ import annotations

import torch

from flexlamps.engine.batch.prefix import prefill_prefix
from flexlamps.engine.executors.step import Step


def shares_prefill(prompt_len: int, n: int, shared: int) -> bool:
    """Whether the samples of a prompt share its prefill: more than one sample, and prompt
    tokens of its own before the last beyond the call's shared prefix (`shared`)."""
    return n > 1 and prompt_len - 1 > shared


def prefill_tokens_computed(prompts: list[tuple[int, int]], shared: int, reuse: bool) -> int:
    """Prefill tokens one call computes for (prompt length, n) pairs after a shared prefix of
    `shared` tokens (computed once); `reuse`: samples share their prompt's prefill."""
    total = shared
    for length, n in prompts:
        if reuse and shares_prefill(length, n, shared):
            total += length - 1 - shared + n
        else:
            total += n * (length - shared)
    return total


class SharedPrefills:
    """The one-row caches of prompts whose samples are being admitted: made when the first sample
    of a prompt is admitted, released once its last one is."""

    def __init__(self, executor, prefix_cache, shared: int, enabled: bool):
        self.executor, self.prefix_cache, self.shared, self.enabled = executor, prefix_cache, shared, enabled
        self._caches: dict[int, list] = {}  # prompt index -> [one-row cache, samples still to admit]

    def split(self, group: list, cache) -> tuple[list, list]:
        """(sequences to prefill as usual, sequences whose prompt but the last token was copied into
        their rows of `cache`: they run that token alone)."""
        plain, tails = [], []
        for seq in group:
            if not (self.enabled and shares_prefill(len(seq.prompt_ids), seq.params.n, self.shared)):
                plain.append(seq)
                continue
            entry = self._caches.get(seq.index)
            if entry is None:
                ids = seq.prompt_ids
                one_row, _ = prefill_prefix(self.executor, ids[self.shared:-1], self.prefix_cache, self.shared)
                entry = self._caches[seq.index] = [one_row, seq.params.n]
            cache.copy_prefix_from(entry[0], len(seq.prompt_ids) - 1, torch.tensor([seq.slot]))
            entry[1] -= 1
            if entry[1] == 0:
                self._caches.pop(seq.index)[0].release()
            tails.append(seq)
        return plain, tails

    def release(self) -> None:
        for one_row, _ in self._caches.values():
            one_row.release()
        self._caches.clear()


def last_token_step(batch: list) -> Step:
    """Each sequence's last prompt token at its position (the tokens before it already cached),
    fed as a prompt: two columns, the second a padding one (as `generate`'s prefill pads), so the
    token takes the prompt's arithmetic (`weight_kind.phase_of`), as when the prompt is prefilled
    whole, not a decode step's."""
    ids = torch.zeros(len(batch), 2, dtype=torch.long)
    ids[:, 0] = torch.tensor([s.prompt_ids[-1] for s in batch])
    pos = torch.tensor([[len(s.prompt_ids) - 1, len(s.prompt_ids)] for s in batch]).reshape(len(batch), 2)
    lengths = torch.ones(len(batch), dtype=torch.long)
    return Step(ids, pos, torch.tensor([s.slot for s in batch]), lengths - 1, lengths=lengths)
