"""The share of a decode step's routed-expert reads the engine's expert cache serves, priced by
running its eviction rule over routing measured on the user's prompts (`RoutingProfile.traces`).

The offload engine keeps experts it read off the disk tier (beside a GPU: off the cpu tier too)
in the gpu tier's free room (`flexlamps.engine.executors.expert_weights.ExpertCache`, "cyclic"):
a sweep visits the layers in turn; while layer j reads its misses, the room they need is taken
from the cached experts whose layer comes back last (the layer just run first), least often
routed first within a layer; after the layer its misses are kept. Between steps the output
head's staged rows take part of the room (the last layer's experts give way first). Consecutive
decode steps of a sequence route to many of the same experts, so the hits depend on that locality, which
independent draws from the routing frequencies miss by far (a random Qwen3-MoE shape at batch 8:
0.23 from the room alone, 0.5 measured). This module replays it over the traced steps, `batch`
sequences at a time (a step reads the union of their experts), and counts the decode steps' hits.
Which experts live on the slow tiers comes from routing counts, and the sequences the engine runs
are not the traced ones: each group is replayed with the experts placed by the other traces'
counts (`held_out_kinds`), as a prompt the profile never saw meets them; priced by its own counts,
a sequence's habitual experts would sit on the fast tiers and its slow-tier reads would be the
few rare ones a small cache holds (a random Qwen3-MoE shape at batch 1, 6 experts' room: 0.45
priced that way, 0.08-0.10 measured on held-out prompts). Pure Python, torch-free, as the planner.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from placement.routing import RoutingProfile

KindsOf = Callable[[list[int]], dict[int, set[int]]]  # a group's trace indices -> its cached kinds


def trace_groups(num_traces: int, batch: int) -> list[list[int]]:
    """The traced sequences' indices `batch` at a time, cycling through them to fill the last group."""
    return [[(start + i) % num_traces for i in range(batch)] for start in range(0, num_traces, batch)]


def batched_steps(profile: RoutingProfile, batch: int) -> list[list[dict[int, set[int]]]]:
    """The traced sequences run `batch` at a time (`trace_groups`): per group, per step, MoE
    layer -> the union of its sequences' experts; step 0 is the prompts'."""
    return [_union_steps([profile.traces[i] for i in members]) for members in trace_groups(len(profile.traces), batch)]


def _union_steps(members: list) -> list[dict[int, set[int]]]:
    steps = []
    for t in range(max(len(m) for m in members)):
        union: dict[int, set[int]] = {}
        for member in members:
            for layer, experts in (member[t] if t < len(member) else {}).items():
                union.setdefault(int(layer), set()).update(experts)
        steps.append(union)
    return steps


def held_out_kinds(profile: RoutingProfile, layers, slow_experts) -> KindsOf:
    """Per group of traces, per MoE layer, the experts on the slow tiers (`slow_experts(j)` of
    them, the coldest) as the other traces' routing counts order them (all of them when the group
    holds every trace: then the profile's own counts)."""
    per_trace = profile.trace_counts

    def kinds(members: list[int]) -> dict[int, set[int]]:
        held = set(members)
        others = [counts for i, counts in enumerate(per_trace) if i not in held]
        out = {}
        for j in layers:
            if others:
                total = Counter()
                for counts in others:
                    total.update(counts.get(j, {}))
                order = _order(total, profile.num_experts)
            else:
                order = profile.expert_order(j)
            out[j] = _coldest(order, slow_experts(j))
        return out
    return kinds


def _order(counts: Counter, num_experts: int) -> list[int]:
    return sorted(range(num_experts), key=lambda e: (-counts[e], e))


def _coldest(order: list[int], count: int) -> set[int]:
    return set(order[len(order) - count:]) if count > 0 else set()


def expert_hit_rate(profile: RoutingProfile, batch: int, capacity: int, cached_kinds: dict[int, set[int]] | KindsOf,
                    num_layers: int, between_steps: int | None = None) -> float:
    """Hits over reads of the experts in `cached_kinds` (per MoE layer, those read off a tier whose
    copies the cache keeps; or a function of a group's trace indices giving them, `held_out_kinds`,
    then at most half the traces a group) in decode steps, with room for `capacity` of them
    (cached and staged together) while a layer runs and `between_steps` cached between steps
    (None: `capacity`), replaying the engine's "cyclic" rule over the traces `batch` sequences at
    a time (`num_layers`: the model's, as the rule counts layers). 0 without traces or room."""
    if not profile.traces or capacity <= 0:
        return 0.0
    between_steps = capacity if between_steps is None else min(capacity, between_steps)
    # held out, a group leaves at least half the traces to place its slow-tier experts
    most = len(profile.traces) // 2 if callable(cached_kinds) and len(profile.traces) > 1 else len(profile.traces)
    if batch > most:
        # more sequences than that: repeating traces would share their experts and overcount the
        # hits; `most` at a time instead, each with its share of the room
        scale = most / batch
        capacity, between_steps = int(capacity * scale), int(between_steps * scale)
        batch = most
    kinds_of = cached_kinds if callable(cached_kinds) else (lambda _: cached_kinds)
    hits = reads = 0
    for members in trace_groups(len(profile.traces), batch):
        kinds = kinds_of(members)
        group_hits, group_reads = _replay(_union_steps([profile.traces[i] for i in members]), kinds,
                                          capacity, max(0, between_steps), num_layers)
        hits, reads = hits + group_hits, reads + group_reads
    return hits / reads if reads else 0.0


def _replay(steps: list[dict[int, set[int]]], cached_kinds: dict[int, set[int]], capacity: int,
            between_steps: int, num_layers: int) -> tuple[int, int]:
    """(hits, reads) of one group's decode steps (see `expert_hit_rate`)."""
    hits = reads = 0
    cache: dict[tuple[int, int], None] = {}  # in recency order, as the engine's
    routed: Counter = Counter()
    for t, step in enumerate(steps):
        for j in sorted(step):
            wanted = [(j, e) for e in sorted(step[j]) if e in cached_kinds.get(j, ())]
            routed.update(wanted)
            hit = {k for k in wanted if k in cache}
            _make_room(cache, hit, len(wanted) - len(hit), capacity, j, num_layers, routed)
            for key in wanted:  # hits used again, misses kept (as many as the room holds)
                cache.pop(key, None)
                cache[key] = None
            _make_room(cache, set(), 0, capacity, j, num_layers, routed)
            if t > 0:  # decode steps: what the planner prices
                hits, reads = hits + len(hit), reads + len(wanted)
        _make_room(cache, set(), 0, between_steps, num_layers, num_layers, routed)  # the head's rows
    return hits, reads


def _make_room(cache: dict, in_use: set, staged: int, capacity: int, now: int, num_layers: int,
               routed: Counter) -> None:
    """Drop cached experts (never those in use) until `staged` more fit: the layer that comes back
    last first (the one just run), least often routed first within it, least recent among equals."""
    excess = len(cache) + staged - capacity
    if excess <= 0:
        return
    victims = sorted((k for k in cache if k not in in_use), key=lambda k: (-((k[0] - now) % num_layers), routed[k]))
    for key in victims[:excess]:
        del cache[key]
