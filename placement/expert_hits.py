"""The share of a decode step's routed-expert reads the engine's expert cache serves, priced by
running its eviction rule over routing measured on the user's prompts (`RoutingProfile.traces`).

The offload engine keeps experts it read off the disk tier (beside a GPU: off the cpu tier too)
in the gpu tier's free room (`flexlamps.engine.executors.expert_weights.ExpertCache`, "cyclic"):
a sweep visits the layers in turn; while layer j reads its misses, the room they need is taken
from the cached experts whose layer comes back last (the layer just run first), least often
routed first within a layer; after the layer its misses are kept. Consecutive decode steps of
a sequence route to many of the same experts, so the hits depend on that locality, which
independent draws from the routing frequencies miss by far (a random Qwen3-MoE shape at batch 8:
0.23 from the room alone, 0.5 measured). This module replays it over the traced steps, `batch`
sequences at a time (a step reads the union of their experts), and counts the decode steps' hits.
Pure Python, torch-free, as the planner.
"""

from __future__ import annotations

from collections import Counter

from placement.routing import RoutingProfile


def batched_steps(profile: RoutingProfile, batch: int) -> list[list[dict[int, set[int]]]]:
    """The traced sequences run `batch` at a time (cycling through them to fill the last group):
    per group, per step, MoE layer -> the union of its sequences' experts; step 0 is the prompts'."""
    traces = profile.traces
    groups = []
    for start in range(0, len(traces), batch):
        members = [traces[(start + i) % len(traces)] for i in range(batch)]
        steps = []
        for t in range(max(len(m) for m in members)):
            union: dict[int, set[int]] = {}
            for member in members:
                for layer, experts in (member[t] if t < len(member) else {}).items():
                    union.setdefault(int(layer), set()).update(experts)
            steps.append(union)
        groups.append(steps)
    return groups


def expert_hit_rate(profile: RoutingProfile, batch: int, capacity: int, cached_kinds: dict[int, set[int]],
                    num_layers: int) -> float:
    """Hits over reads of the experts in `cached_kinds` (per MoE layer, those read off a tier whose
    copies the cache keeps) in decode steps, with room for `capacity` of them (cached and staged
    together), replaying the engine's "cyclic" rule over the traces `batch` sequences at a time
    (`num_layers`: the model's, as the rule counts layers). 0 without traces or room."""
    if not profile.traces or capacity <= 0:
        return 0.0
    if batch > len(profile.traces):
        # more sequences than were traced: repeating traces would share their experts and overcount
        # the hits; the traced ones at a time instead, each with its share of the room
        capacity, batch = capacity * len(profile.traces) // batch, len(profile.traces)
    hits = reads = 0
    for steps in batched_steps(profile, batch):
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
    return hits / reads if reads else 0.0


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
