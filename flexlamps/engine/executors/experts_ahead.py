"""Routed experts read a layer ahead: once a decode step's MoE layer has routed its tokens, the
next layer's router scores the same inputs (the residual stream changes little in one layer:
Pre-gated MoE, arXiv 2308.12066; AdapMoE's gate lookahead) and the next layer's predicted experts
that live on disk start reading into the expert cache. The next layer's own reads then find them
there, or wait for the read in flight, instead of starting only when its router names them: the
disk overlaps this layer's experts and the next layer's attention, as the planner's decode terms
price it (`max(dtoc, comp)` a layer).

A prediction only moves bytes: which experts a token uses is still its own router's choice, so the
outputs are the same bits. A read ahead is charged to the gpu tier while in flight, and only where
the sweep's charged peak (`limit`: what its dry run charges) and the reads in flight leave that
room, so it never takes a run past its budget; it lands as cached bytes (given back on demand)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import torch

from flexlamps.models.blocks.linear import linear
from offload import BudgetExceededError

ROUTER = "router"  # a MoE layer's router, by local name (`models.blocks.moe`)


class ExpertsAhead:
    """Reads ahead over one `WeightStore` (`weights`, written) for decode steps of `picks` experts
    a token; `place(layer, expert)`: where it lives (`ExpertPlace`)."""

    def __init__(self, weights, place, picks: int):
        self.store, self.cache, self.experts = weights.store, weights.expert_cache, weights.experts
        self.place, self.picks, self._bytes_of = place, picks, weights.staged
        self._routers = {spec.layer: spec.name for specs in weights.layer_specs for spec in specs
                         if spec.local_name == ROUTER}
        self._inflight: dict[tuple[int, int], Future] = {}  # by (layer, expert), until its layer asks
        self._reads: list[tuple[Future, int]] = []  # the sweep's reads ahead and their bytes (`end_layer`)
        self._inflight_bytes = 0
        self._limit_of, self._limit = None, None
        self._lock = threading.Lock()
        self.started = self.used = 0  # reads ahead started; those the next layer's router picked

    def begin_sweep(self, limit) -> None:
        """A sweep starts: `limit()` gives its charged gpu peak (asked once, when a read could start)."""
        self._limit_of, self._limit = limit, None

    def after_router(self, layer: int, h: torch.Tensor) -> None:
        """Layer `layer` routed its inputs `h` (N, hidden): read the next layer's likely experts."""
        nxt = layer + 1
        router = self._routers.get(nxt)
        if (self.cache.order == "off" or nxt not in self.experts or router is None  # "off": nowhere to keep them
                or self.store.tier_of(router) == "disk"):
            return
        w = self.store.resident([router])[router]
        scores = linear(h.to(getattr(w, "device", h.device)), w)
        for e in scores.topk(self.picks, dim=-1).indices.unique().tolist():
            self._start(nxt, e)

    def _start(self, layer: int, e: int) -> None:
        key, place = (layer, e), self.place(layer, e)
        if key in self._inflight or not place.copied or place.resident or place.on_cpu_tier or key in self.cache:
            return
        names = self.experts[layer][e]
        nbytes = self._bytes_of(names)
        if not self._room(nbytes):
            return
        with self._lock:
            self._inflight_bytes += nbytes
        self._inflight[key] = self.store.submit(lambda: self._read(key, names, nbytes))
        self._reads.append((self._inflight[key], nbytes))
        self.started += 1

    def _room(self, nbytes: int) -> bool:
        """Whether the sweep's charged peak, the reads in flight and this one fit the gpu tier."""
        budget = self.cache.budget
        if self._limit is None:
            asked = self._limit_of() if self._limit_of is not None else budget.capacity_bytes
            self._limit = min(asked, budget.capacity_bytes)
        return self._limit + self._inflight_bytes + nbytes <= budget.capacity_bytes

    def _read(self, key: tuple[int, int], names: list[str], nbytes: int) -> bool:
        """On an I/O thread: the expert into the cache; False where it could not be kept."""
        try:
            fetched, staged = self.store.fetch(names)
        except BudgetExceededError:  # the room went meanwhile: its layer reads it in turn
            return False
        finally:
            with self._lock:
                self._inflight_bytes -= nbytes
        if not self.cache.put(key, fetched, staged):
            self.store.release(staged)
            return False
        return True

    def routed(self, layer: int, experts) -> None:
        """Layer `layer`'s router named `experts`, before their reads start: reads ahead of its other
        experts that have not started yet are called off (the disk goes to the named ones first)."""
        for key in [k for k in self._inflight if k[0] == layer and k[1] not in experts]:
            self._call_off(self._inflight.pop(key))

    def _call_off(self, future: Future) -> None:
        """A read ahead not started is cancelled (its room given back); one started lands."""
        if not future.done() and future.cancel():
            with self._lock:
                self._inflight_bytes -= next(n for f, n in self._reads if f is future)

    def take(self, key: tuple[int, int]) -> Future | None:
        """The read ahead of `key` (layer, expert), where one was started: its layer waits on it
        before asking the cache."""
        future = self._inflight.pop(key, None)
        self.used += future is not None
        return future

    def end_layer(self, layer: int) -> None:
        """Layer `layer` ran: its reads ahead it did not ask for land in the cache; after the last
        layer with experts every one has landed (none is in flight past its sweep)."""
        for key in [k for k in self._inflight if k[0] == layer]:
            del self._inflight[key]
        if layer == max(self.experts):
            self._drain()

    def _drain(self) -> None:
        for future, _ in self._reads:
            self._call_off(future)
            if not future.cancelled():
                future.exception()  # `_read` catches what it expects; anything else surfaces at the layer's wait
        self._reads = []
