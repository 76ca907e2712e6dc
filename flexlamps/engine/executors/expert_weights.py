"""Routed experts read on demand: a MoE layer's weights handed to the forward as a mapping that
fetches an expert's matrices when the forward first reads them (after its router has run), so
a step moves from the cpu and disk tiers only the experts its tokens route to (the union over
the micro-batches); and a hot set of experts kept on the compute device in the gpu tier's free
room (`ExpertCache`).

Model code sees a read-only mapping, as it would a dict, and knows nothing of tiers;
`routed_to({expert: tokens})` is a hint the MoE FFN gives once its router has run, so the
routed experts' loads go out together (and a routing profile can count them). An expert is `experts.{e}.*` in its layer (every MoE
family's naming: the router and shared experts are plain weights, fetched with the layer).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future

from flexlamps.engine.executors.expert_groups import ExpertGroups
from offload import TierBudget

EXPERT_NAME = re.compile(r"^experts\.(\d+)\.")
CACHE_ORDERS = ("cyclic", "lru", "frequency", "off")


def expert_index(local_name: str) -> int | None:
    """The routed expert a layer's weight belongs to (`experts.{e}.…`), None for the rest."""
    match = EXPERT_NAME.match(local_name)
    return int(match.group(1)) if match else None


def experts_by_layer(specs) -> dict[int, dict[int, list[str]]]:
    """Each layer's routed experts: expert index -> its stored weights' names, in spec order."""
    out: dict[int, dict[int, list[str]]] = {}
    for spec in specs:
        expert = expert_index(spec.local_name) if spec.layer is not None else None
        if expert is not None:
            out.setdefault(spec.layer, {}).setdefault(expert, []).append(spec.name)
    return out


def expert_owners(experts: dict[int, list[str]]) -> dict[str, int]:
    """Each expert weight's local name -> its expert."""
    return {name: e for e, names in experts.items() for name in names}


def stale_then_cyclic(key: tuple[int, int], used: int, visited: int, now: int, num_layers: int, routed: int):
    """The "cyclic" eviction order's sort key of cached expert `key` (layer, expert), last used in
    sweep `used`, its layer last visited in sweep `visited`: stale ones (not used at that visit)
    first, unused longest first; then the layer that comes back last from layer `now`, least often
    `routed` first. (The planner's replay, `placement.expert_hits`, prices the layer order alone:
    at batch 1 it then counts fewer hits than this rule gives, a price on the slow side.)"""
    fresh = used >= visited
    return fresh, 0 if fresh else used, -((key[0] - now) % num_layers), routed


class LayerWeights(Mapping):
    """One layer's weights by local name: `eager` ones already fetched, each routed expert's
    fetched by `load(experts) -> {local name: weight}` on its first read. With `begin(experts,
    tokens) -> {expert: Future of its weights}`, a routing hint starts the reads without waiting,
    and a read of an expert waits for its own only. `group`: at most this many experts staged at
    once (0: no cap), `holds(e)` saying which take room and `evict(e)` giving one back once the
    forward is done with it (`expert_groups.ExpertGroups`)."""

    def __init__(self, eager: dict, experts: dict[int, list[str]], load, on_route=None, begin=None,
                 group: int = 0, holds=None, evict=None, owner: dict[str, int] | None = None, on_inputs=None):
        self._values = dict(eager)
        self._on_inputs = on_inputs
        self._names = experts
        self._owner = owner if owner is not None else expert_owners(experts)
        self._load, self._on_route, self._begin, self._evict = load, on_route, begin, evict
        self._pending: dict[int, Future] = {}
        self._tokens: dict[int, int] | None = None  # the latest routing hint
        self._groups = ExpertGroups(group, self._start, self._give_back,
                                    None if holds is None else (lambda e: holds(e, self._tokens)))

    def routed_to(self, tokens: dict[int, int]) -> None:
        """A step's routing (expert -> its tokens): start fetching those experts now, in
        expert order as the group has room (a hint; reads work without it), and report it to
        `on_route`."""
        if self._on_route is not None:
            self._on_route(tokens)
        self._tokens = tokens
        staged = {e for e in self._names if e in self._pending or self._names[e][0] in self._values}
        self._groups.want([e for e in sorted(tokens) if e in self._names], staged)

    def routed_inputs(self, h) -> None:
        """A decode step's routed inputs (N, hidden), once `routed_to` has started this layer's
        reads: a hint for reading the next layer's experts ahead (`experts_ahead`)."""
        if self._on_inputs is not None:
            self._on_inputs(h)

    def ready_first(self, experts: list[int]):
        """`experts` in the order to compute them (the MoE FFN's decode asks): each time the first,
        in the order given, whose read has landed (computing it frees its room in the group for the
        next read), else the first whose weights are here without a read (used where they live, or
        cached), else the first left, whose read the forward then waits for. The reads in flight
        overlap the work on the experts at hand instead of holding it up."""
        left = list(experts)
        while left:
            landed = [e for e in left if e in self._pending and self._pending[e].done()]
            here = landed or [e for e in left if e not in self._pending and self._names[e][0] in self._values]
            e = (here or left)[0]
            left.remove(e)
            yield e

    def expert_done(self, expert: int) -> None:
        """The forward has computed `expert` on its tokens: its room may go to the next read."""
        self._groups.finished(expert)

    def _start(self, e: int) -> None:
        if self._begin is None:
            self._values.update(self._load([e], self._tokens))
            return
        for expert, got in self._begin([e], self._tokens).items():  # a dict: no read was needed
            if isinstance(got, Future):
                self._pending[expert] = got
            else:
                self._values.update(got)

    def _give_back(self, e: int) -> None:
        pending = self._pending.pop(e, None)
        if pending is not None:  # a read still in flight: its bytes are staged once it lands
            pending.exception()
        for name in self._names[e]:
            self._values.pop(name, None)
        if self._evict is not None:
            self._evict(e)

    def close(self) -> None:
        """The layer ran: let go of its weights now. Its groups' callbacks make this object a cycle
        that only the cyclic collector frees, which left a decode step's read experts alive, uncharged,
        for several steps (~100 MiB at batch 1 in the MoE bench)."""
        self._values.clear()
        self._pending.clear()

    def __getitem__(self, key: str):
        if key not in self._values and key in self._owner:
            expert = self._owner[key]
            if expert in self._groups.queue:
                self._groups.pump(first=expert)
            pending = self._pending.pop(expert, None)
            if key not in self._values:
                self._values.update(pending.result() if pending is not None else self._load([expert], None))
        return self._values[key]

    def __contains__(self, key) -> bool:
        return key in self._values or key in self._owner

    def __iter__(self):
        yield from self._values
        yield from (k for k in self._owner if k not in self._values)

    def __len__(self) -> int:
        return len(self._values) + sum(k not in self._values for k in self._owner)


class ExpertCache:
    """Experts read from the cpu or disk tier, kept on the compute device after their layer ran,
    in the gpu budget's free room: their bytes are the budget's cached bytes, dropped on demand
    when an allocation needs the room (`TierBudget.reclaim`). Which go first:
    - "cyclic" (the default): first those stale, not asked for when their layer last ran (a
      prompt's experts no decode step has wanted since, those a batch-1 sequence's tokens left;
      unused longest first), then those whose layer comes back last, as sweeps visit the layers
      in turn (the layer just run first: Belady's choice for this scan), least often routed first
      within a layer. "lru" would drop the layer that comes next, and a cache smaller than a
      step's reads would then never hit; with the layer order alone, a batch-1 decode's few
      experts a step, reused step after step, went between steps (the output head's rows take
      room) while a prompt's stale experts stayed (moe18: ~2 of a step's 32 read again each step);
    - "lru": least recently used; "frequency": least often routed (counts over the run).
    A hit's bytes are in use until its layer ends (`take`, then `keep`). `num_layers`: the
    model's, for "cyclic"."""

    def __init__(self, budget: TierBudget, order: str = "cyclic", num_layers: int = 1):
        if order not in CACHE_ORDERS:
            raise ValueError(f"expert cache order {order!r}: use one of {', '.join(CACHE_ORDERS)}")
        self.budget, self.order, self.num_layers = budget, order, max(1, num_layers)
        self._layer_now = 0  # the layer whose experts were last asked for
        self._sweep = 0  # sweeps passed (the last layer run)
        self._used: dict[tuple[int, int], int] = {}  # each kept expert's last sweep of use
        self._visited: dict[int, int] = {}  # each layer's last sweep that asked for an expert
        self._entries: OrderedDict[tuple[int, int], tuple[dict, int]] = OrderedDict()  # by recency
        self._in_use: set[tuple[int, int]] = set()
        self.routed = Counter()  # (layer, expert) -> times routed to (read by a step)
        self.hits = self.misses = 0
        self._lock = threading.Lock()
        if order != "off":
            budget.reclaim = self.reclaim

    def get(self, key: tuple[int, int]) -> dict | None:
        """A kept expert's fetched weights (now in use), or None (a miss: fetch it)."""
        with self._lock:
            self.routed[key] += 1
            self._layer_now = key[0]
            self._visited[key[0]] = self._sweep
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self._used[key] = self._sweep
            self._entries.move_to_end(key)
            self._in_use.add(key)
            self.budget.take(entry[1])
            return entry[0]

    def __contains__(self, key: tuple[int, int]) -> bool:
        with self._lock:
            return key in self._entries

    def passed(self, layer: int) -> None:
        """Layer `layer` ran: the sweep stands before the next one, so until it asks, the layer just
        run is the one that comes back last (what is staged between layers, the output head's rows
        after the last, takes its experts' room first, not the next layers')."""
        with self._lock:
            self._layer_now = (layer + 1) % self.num_layers
            self._sweep += layer == self.num_layers - 1

    def put(self, key: tuple[int, int], fetched: dict, nbytes: int) -> bool:
        """Keep a fetched expert (its `nbytes` staged bytes become cached); False when off."""
        if self.order == "off":
            return False
        with self._lock:
            self._entries[key] = (fetched, nbytes)
            self._used[key] = self._sweep
            self._entries.move_to_end(key)
            self.budget.keep(nbytes)
        return True

    def release(self, key: tuple[int, int]) -> None:
        """A hit's layer is done: its bytes are cached again."""
        with self._lock:
            self._in_use.discard(key)
            self.budget.keep(self._entries[key][1])

    def reclaim(self, nbytes: int) -> None:
        with self._lock:
            victims = [k for k in self._entries if k not in self._in_use]
            if self.order == "frequency":
                victims.sort(key=lambda k: self.routed[k])  # stable: least recent first among equals
            elif self.order == "cyclic":  # stale first, then furthest next use: (layer - now) mod L, largest first
                victims.sort(key=lambda k: stale_then_cyclic(k, self._used[k], self._visited.get(k[0], -1),
                                                             self._layer_now, self.num_layers, self.routed[k]))
            for key in victims:
                if nbytes <= 0:
                    break
                nbytes -= self._drop(key)

    def clear(self) -> None:
        with self._lock:
            for key in [k for k in self._entries if k not in self._in_use]:
                self._drop(key)

    def _drop(self, key) -> int:
        nbytes = self._entries.pop(key)[1]
        self._used.pop(key, None)
        self.budget.drop(nbytes)
        return nbytes

    def stats(self) -> dict[str, float]:
        reads = self.hits + self.misses
        return {"order": self.order, "hits": self.hits, "misses": self.misses,
                "hit_rate": self.hits / reads if reads else 0.0, "kept": len(self._entries),
                "kept_bytes": self.budget.cached_bytes}


def local_expert_names(experts: dict[int, list[str]], local: dict[str, str]) -> tuple[dict, dict]:
    """A layer's experts' weights by local name (expert -> names) and their owners (name -> expert)."""
    by_expert = {e: [local[name] for name in names] for e, names in experts.items()}
    return by_expert, expert_owners(by_expert)


@dataclasses.dataclass(frozen=True)
class ExpertPlace:
    """Where one expert's weights live (fixed for a store), as its reads ask it each step."""
    resident: bool  # all on the gpu tier
    on_cpu_tier: bool  # all on the cpu tier
    in_host_memory: bool  # on the cpu tier as the CPU multiplies them (computed in place)
    copied: bool  # a fetch makes a copy (read off disk, or moved to another device): worth keeping

    @classmethod
    def of(cls, store, names: list[str]) -> ExpertPlace:
        tiers = {store.tier_of(name) for name in names}
        on_cpu = tiers == {"cpu"}
        # beside a GPU only plain tensors are multiplied by the CPU (a 4-bit weight there is in the
        # GPU kernel's layout); on a CPU-only machine any cpu-tier expert is its resident tensors
        host = on_cpu and (store.device.type == "cpu" or all(store.is_plain(n) for n in names))
        return cls(tiers == {"gpu"}, on_cpu, host, "disk" in tiers or store.device.type != "cpu")


def expert_place(places: dict, store, layer: int, expert: int, names: list[str]) -> ExpertPlace:
    """Expert `expert` of `layer`'s place (its weights `names`), worked out once a store: `places`
    is the sweep's memo, shared by a layer's loads and the reads ahead of it."""
    if (layer, expert) not in places:
        places[layer, expert] = ExpertPlace.of(store, names)
    return places[layer, expert]


class RoutedExpertLoads:
    """Layer `layer`'s expert reads in one sweep: each routed expert fetched from its tiers (or
    found in the cache), its staged bytes charged to the gpu tier until `finish`, which keeps the
    copies worth keeping (those read off disk, or copied to another device) in the cache.
    `convert(fetched) -> ({local name: weight}, bytes charged)` turns fetched weights into what
    the forward multiplies (as the layer's other weights are).

    Compute where they live: when the layer's first routed call sends fewer than `in_place_below`
    tokens per expert (`Policy.cpu_expert_tokens`, set by the planner from the machine's rates), its
    cpu-tier experts are handed to the forward as they live in host memory, neither copied nor
    charged, and the MoE FFN runs them on the CPU (`blocks.moe`); with more, they are copied to the
    compute device for a batched GEMM. `reads` counts the cpu-tier experts read each way.

    Groups: with `group` (`Policy.expert_group`), at most that many experts hold staged bytes at
    once; one the forward is done with is given back (`evict`: into the cache, or released) when
    the next read needs its room (`expert_groups`)."""

    def __init__(self, store, cache: ExpertCache, layer: int, experts: dict[int, list[str]], convert,
                 in_place_below: int = 0, reads: Counter | None = None, group: int = 0,
                 places: dict[tuple[int, int], ExpertPlace] | None = None, as_stored: dict | None = None,
                 ahead=None):
        self.store, self.cache, self.layer = store, cache, layer
        self.ahead = ahead  # `experts_ahead.ExpertsAhead`: reads of this layer's experts started a layer early
        self._places = {} if places is None else places  # where each expert lives: fixed for a store
        self._as_stored = {} if as_stored is None else as_stored  # (layer, expert) -> weights multiplied as stored
        self.experts, self.convert = experts, convert
        self.in_place_below, self.group = in_place_below, group
        self.reads = Counter() if reads is None else reads
        self._in_place: bool | None = None  # decided on the layer's first routing hint
        self._staged: list[tuple[tuple[int, int], dict, int]] = []  # fetched now
        self._hits: list[tuple[int, int]] = []
        # reads started by `begin`, by expert: a Future holds its weights, so `evict` drops it
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()  # `_staged` and `charged` grow on the I/O threads too
        self.charged = 0  # bytes `convert` charged (decompressed copies), freed by `finish`
        self._charged_by = Counter()  # the same per expert, for `evict`

    def mapping(self, eager: dict, local: dict[str, str], counter=None,
                names: tuple[dict[int, list[str]], dict[str, int]] | None = None) -> LayerWeights:
        """The layer's weights for the forward: `eager` ones, and these experts on first read
        (`local`: stored name -> local name; `counter`: a RoutingCounter told the routing;
        `names`: `local_expert_names`' result for this layer, where the caller keeps it)."""
        on_route = None if counter is None else (lambda tokens: counter.add(self.layer, tokens))
        by_expert, owner = names if names is not None else local_expert_names(self.experts, local)
        on_inputs = None if self.ahead is None else (lambda h: self.ahead.after_router(self.layer, h))
        return LayerWeights(eager, by_expert, self.load, on_route, self.begin, self.group, self.holds, self.evict,
                            owner, on_inputs)

    def holds(self, e: int, tokens: dict[int, int] | None = None) -> bool:
        """Whether expert e takes staged gpu bytes once read: not when used where it lives."""
        self._decide_in_place(tokens)
        place = self._place(e)
        return not (place.resident or (self._in_place and place.in_host_memory))

    def evict(self, e: int) -> None:
        """The forward is done with expert e before the layer ends: its bytes go back now, as
        `finish` gives them back (a copy worth keeping into the cache, a hit released)."""
        key = (self.layer, e)
        with self._lock:
            staged = [entry for entry in self._staged if entry[0] == key]
            self._staged = [entry for entry in self._staged if entry[0] != key]
            charged = self._charged_by.pop(e, 0)
            self.charged -= charged
        self.cache.budget.free(charged)
        self._pending.pop(e, None)  # its read landed (the forward used it): the weights go with it
        if key in self._hits:
            self._hits.remove(key)
            self.cache.release(key)
        self._give_back(staged)

    def load(self, experts: list[int], tokens: dict[int, int] | None = None) -> dict:
        """`experts`' weights for the forward, read now (`tokens`: the routing hint, expert -> its tokens)."""
        self._decide_in_place(tokens)
        out = {}
        for e in experts:
            read_ahead = self._read_ahead(e)
            if read_ahead is not None:
                read_ahead.exception()  # landed in the cache, or not kept: then read in turn
            ready = self._ready(e)
            out.update(ready if ready is not None else self._read(e))
        return out

    def begin(self, experts: list[int], tokens: dict[int, int] | None = None) -> dict[int, Future | dict]:
        """`load` without waiting: {expert: a Future of its weights}. Those used where they live or
        found in the cache come back as their weights (no Future); each read off the cpu or disk tier goes to the store's
        I/O threads in routing order, so the forward computes the first experts while the later
        ones are read (the overlap of the reads only a layer's router can name)."""
        self._decide_in_place(tokens)
        out = {}
        for e in experts:
            read_ahead = self._read_ahead(e)
            if read_ahead is not None and not read_ahead.done():
                out[e] = self._pending[e] = self._after(read_ahead, e)
                continue
            ready = self._ready(e)
            if ready is None:
                out[e] = self._pending[e] = self.store.submit(lambda e=e: self._read(e))
            else:
                out[e] = ready
        return out

    def _read_ahead(self, e: int) -> Future | None:
        return None if self.ahead is None else self.ahead.take((self.layer, e))

    def _after(self, read_ahead: Future, e: int) -> Future:
        """A Future of expert e's weights once its read ahead lands: a cache hit then (or, where
        the read could not be kept, read in turn on the I/O thread that finished it)."""
        out = Future()

        def landed(_):
            try:
                ready = self._ready(e)
                out.set_result(ready if ready is not None else self._read(e))
            except BaseException as exc:  # the forward raises it where it waits
                out.set_exception(exc)

        read_ahead.add_done_callback(landed)
        return out

    def _decide_in_place(self, tokens: dict[int, int] | None) -> None:
        if self._in_place is None and tokens:
            self._in_place = sum(tokens.values()) / len(tokens) < self.in_place_below
            if self.ahead is not None:  # the layer's routing is known: reads ahead it did not pick give way
                self.ahead.routed(self.layer, tokens)

    def _ready(self, e: int) -> dict | None:
        """Expert e's weights where no read is needed (computed in place, on the gpu tier, or a
        cache hit), else None."""
        place = self._place(e)
        if self._in_place and place.in_host_memory:
            self.reads["in place"] += 1
            return self._in_place_weights(e)
        self.reads["staged"] += place.on_cpu_tier
        if place.resident:
            return self._converted(e, self.store.fetch(self.experts[e])[0])  # nothing staged
        fetched = self.cache.get((self.layer, e))
        if fetched is None:
            return None
        self._hits.append((self.layer, e))
        return self._converted(e, fetched)

    def _in_place_weights(self, e: int) -> dict:
        """Expert e's resident weights for the forward; kept for later steps where `convert` hands
        them over as stored (nothing decompressed or wrapped, nothing charged: the same every step)."""
        key = (self.layer, e)
        if key in self._as_stored:
            return self._as_stored[key]
        stored = self.store.resident(self.experts[e])
        out = self._converted(e, stored)
        if len(out) == len(stored) and all(a is b for a, b in zip(stored.values(), out.values())):
            self._as_stored[key] = out
        return out

    def _read(self, e: int) -> dict:
        """Fetch expert e from its tiers (on an I/O thread under `begin`); `finish` keeps or releases it."""
        fetched, staged = self.store.fetch(self.experts[e])
        with self._lock:
            self._staged.append(((self.layer, e), fetched, staged))
        return self._converted(e, fetched)

    def _converted(self, e: int, fetched: dict) -> dict:
        out, charged = self.convert(fetched)
        with self._lock:
            self.charged += charged
            self._charged_by[e] += charged
        return out

    def _place(self, expert: int) -> ExpertPlace:
        return expert_place(self._places, self.store, self.layer, expert, self.experts[expert])

    def finish(self) -> None:
        """The layer ran: hits go back to the cache, fetched copies into it (or are released).
        Reads the forward never waited for (it raised) are waited for first."""
        for future in self._pending.values():
            future.exception()  # waits; an error was the forward's to raise, and it stopped
        self._pending = {}
        for key in self._hits:
            self.cache.release(key)
        self._give_back(self._staged)
        self._hits, self._staged = [], []
        self.cache.passed(self.layer)

    def _give_back(self, staged) -> None:
        """Fetched copies worth keeping into the cache, the others' bytes released."""
        for key, fetched, nbytes in staged:
            if not (nbytes and self._place(key[1]).copied and self.cache.put(key, fetched, nbytes)):
                self.store.release(nbytes)

