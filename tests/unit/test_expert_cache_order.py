"""The expert cache's eviction orders on the engine's access pattern: sweeps visit the layers in
turn, each reading its routed experts (staged in the gpu budget, kept in its free room after)."""

import random

import pytest

from flexlamps.engine.executors.expert_weights import ExpertCache
from offload import TierBudget

LAYERS, EXPERTS, PER_LAYER, NBYTES = 4, 32, 8, 100


def _hit_rate(order: str, room_experts: int, steps: int = 40) -> float:
    """Hits over reads when the budget has room for a layer's staging plus `room_experts` kept."""
    budget = TierBudget("gpu", (PER_LAYER + room_experts) * NBYTES)
    cache = ExpertCache(budget, order, LAYERS)
    rng = random.Random(0)
    for _ in range(steps):
        for layer in range(LAYERS):
            hits, staged = [], []
            for e in rng.sample(range(EXPERTS), PER_LAYER):  # uniform routing
                if cache.get((layer, e)) is not None:
                    hits.append((layer, e))
                else:
                    budget.allocate(NBYTES, f"expert {e}")
                    staged.append((layer, e))
            for key in hits:
                cache.release(key)
            for key in staged:
                cache.put(key, {}, NBYTES)
    assert budget.used_bytes == 0 and budget.cached_bytes <= budget.capacity_bytes
    return cache.stats()["hit_rate"]


def test_cyclic_keeps_what_lru_evicts_before_its_layer_comes_back():
    """With room for a third of one sweep's reads, LRU drops each layer's experts just before the
    sweep returns to them; dropping the layer that comes back last keeps a fixed share hitting."""
    room = LAYERS * PER_LAYER // 3
    lru, cyclic = _hit_rate("lru", room), _hit_rate("cyclic", room)
    assert lru < 0.02
    assert cyclic > 0.05 and cyclic > 3 * lru


@pytest.mark.parametrize("order", ["cyclic", "lru", "frequency"])
def test_room_for_every_expert_hits_after_the_first_reads(order):
    assert _hit_rate(order, LAYERS * EXPERTS) >= 0.85  # 128 first reads of 1280 miss


def test_cyclic_drops_the_layer_just_run_first():
    budget = TierBudget("gpu", 4 * NBYTES)
    cache = ExpertCache(budget, "cyclic", LAYERS)
    for layer in range(LAYERS):  # one expert of each layer kept, layer 3 last
        assert cache.get((layer, 0)) is None
        budget.allocate(NBYTES, "expert")
        cache.put((layer, 0), {}, NBYTES)
    cache.get((0, 1))  # the next sweep starts: layer 0 asks (a miss)
    budget.allocate(NBYTES, "expert")  # needs one expert's room
    assert cache.get((3, 0)) is None  # layer 3 (next needed after 1 and 2) went
    assert cache.get((1, 0)) is not None and cache.get((2, 0)) is not None


def test_after_the_last_layer_its_experts_give_way_first():
    """Between sweeps (the output head's rows staged after the last layer) the layer just run comes
    back last: its expert goes, the next sweep's first layers' stay."""
    budget = TierBudget("gpu", 4 * NBYTES)
    cache = ExpertCache(budget, "cyclic", LAYERS)
    for layer in range(LAYERS):
        assert cache.get((layer, 0)) is None
        budget.allocate(NBYTES, "expert")
        cache.put((layer, 0), {}, NBYTES)
        cache.passed(layer)
    budget.allocate(NBYTES, "the head's rows")
    assert cache.get((3, 0)) is None
    assert all(cache.get((layer, 0)) is not None for layer in range(3))


def test_an_expert_its_layer_did_not_ask_for_last_time_gives_way_first():
    """A prompt's expert that its layer's next visit did not ask for (stale) goes before one the
    latest sweep used, even where the latter's layer comes back last (a batch-1 decode reuses its
    few experts step after step; the layer order alone dropped them between steps)."""
    budget = TierBudget("gpu", 3 * NBYTES)
    cache = ExpertCache(budget, "cyclic", LAYERS)

    def read(key):
        assert cache.get(key) is None
        budget.allocate(NBYTES, "expert")
        cache.put(key, {}, NBYTES)

    read((0, 5))  # the prompt's sweep
    for layer in range(LAYERS):
        cache.passed(layer)
    for layer in range(LAYERS):  # a decode sweep: layer 0 wants expert 2, the last layer expert 1
        if layer in (0, LAYERS - 1):
            read((layer, 2 if layer == 0 else 1))
        cache.passed(layer)
    budget.allocate(NBYTES, "the head's rows")
    assert (0, 5) not in cache
    assert (LAYERS - 1, 1) in cache and (0, 2) in cache
