"""A MoE layer's routed experts streamed through the gpu tier in groups: at most `size` of them
hold staged bytes at once (`Policy.expert_group`), so a layer whose tokens touch more experts
than the gpu tier holds still runs, one group after another.

The forward computes its experts in expert order and says when it is done with one (the MoE
FFN's `expert_done` hint). An expert wanted next starts its read as soon as the group has room;
room is made only under pressure, by giving back the expert the forward finished first, so
with room for every expert a sweep touches nothing is given back before the layer ends (a
later micro-batch routed to it finds it staged) and nothing is read twice. An expert routed
to again while staged is kept. Which experts hold bytes is the caller's word (`holds`): those
used where they live (the gpu tier; the cpu tier computed in place) take no room.
"""

from __future__ import annotations

import bisect
import math


class ExpertGroups:
    """The order a layer's expert reads start in, under a cap on the experts staged at once.
    `start(e)` begins expert e's read; `evict(e)` gives back a staged expert the forward is done
    with; `holds(e)`: whether expert e takes staged bytes. `size`: the cap (0: none)."""

    def __init__(self, size: int, start, evict, holds=None):
        self.size = size or math.inf
        self._start, self._evict = start, evict
        self._holds = holds or (lambda e: True)
        self.queue: list[int] = []  # wanted, not started, in the order the forward uses them
        self.held: list[int] = []  # started and holding bytes, in start order
        self.done: set[int] = set()  # held experts the forward has finished with

    def want(self, experts: list[int], staged: set[int]) -> None:
        """A routing's experts, in the order the forward computes them; `staged`: those whose
        weights the forward has or is reading (nothing to start). A held one is needed again."""
        for e in experts:
            if e in staged:
                self.done.discard(e)
            elif e not in self.queue:
                self.queue.append(e)
        self.pump()

    def pump(self, first: int | None = None) -> None:
        """Start queued experts in order while the group has room; `first`: the forward waits on
        that one, so it starts next, and where no finished expert can make room, the staged one
        the forward needs last does (it is read again when its turn comes)."""
        if first is not None and first in self.queue:
            self.queue.remove(first)
            self.queue.insert(0, first)
        while self.queue:
            e = self.queue[0]
            holds = self.size != math.inf and self._holds(e)  # without a cap no room is counted
            if holds and len(self.held) >= self.size and not self._make_room(waited_on=e == first):
                return
            self.queue.pop(0)
            if holds:
                self.held.append(e)
            self._start(e)

    def finished(self, e: int) -> None:
        """The forward is done with expert e (for now): its room may go to the next read."""
        if e in self.held:
            self.done.add(e)
            self.pump()

    def _make_room(self, waited_on: bool) -> bool:
        victim = next((e for e in self.held if e in self.done), None)
        if victim is None and waited_on:  # the forward computes in expert order: the largest comes last
            victim = max(self.held)
            bisect.insort(self.queue, victim, lo=1)
        if victim is None:
            return False
        self.held.remove(victim)
        self.done.discard(victim)
        self._evict(victim)
        return True
