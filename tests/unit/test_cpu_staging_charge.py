"""On a CPU-only machine a cpu-tier tensor is staged as itself: the fetch charges the gpu budget as
the dry run does (the plan's peak), but the charge holds no bytes, so the expert cache keeps what
it holds; bytes that exist still make it give way."""

import pytest
import torch

from flexlamps.engine.executors.expert_weights import ExpertCache
from offload import TierBudget
from offload.budget import BudgetExceededError
from offload.store import TieredStore

ROWS, WIDTH = 64, 16  # a bf16 head piece of 2 KiB
PIECE = ROWS * WIDTH * 2


def _store_and_cache():
    budgets = {"gpu": TierBudget("gpu", 2 * PIECE), "cpu": TierBudget("cpu", 4 * PIECE)}
    store = TieredStore(budgets, device=torch.device("cpu"))
    store.put("head", torch.ones(ROWS, WIDTH, dtype=torch.bfloat16), "cpu")
    cache = ExpertCache(budgets["gpu"], "cyclic", 1)
    budgets["gpu"].allocate(PIECE, "expert (0, 0) read off disk")
    cache.put((0, 0), {}, PIECE)  # kept: the gpu budget holds it in its free room
    return store, cache, budgets["gpu"]


@pytest.mark.parametrize("fetch", ["rows", "whole"])
def test_a_cpu_tier_fetch_on_the_cpu_is_charged_and_evicts_no_kept_expert(fetch):
    store, cache, gpu = _store_and_cache()
    got, staged = store.fetch_rows("head", 0, ROWS) if fetch == "rows" else store.fetch(["head"])
    assert staged == PIECE and gpu.used_bytes == PIECE and gpu.peak_bytes == PIECE  # the plan's charge
    assert (0, 0) in cache and gpu.cached_bytes == PIECE  # before: given way to a view
    _, more = store.fetch_rows("head", 0, ROWS)  # two pieces charged: the budget's capacity
    assert (0, 0) in cache
    with pytest.raises(BudgetExceededError):  # a third is over the plan's gpu budget, as in the dry run
        store.fetch_rows("head", 0, 1)
    store.release(more)
    store.release(staged)
    store.close()


def test_bytes_that_exist_still_make_the_cache_give_way():
    """Checked against every charge and the cache's bytes, as before (on the safe side of a view)."""
    store, cache, gpu = _store_and_cache()
    _, staged = store.fetch_rows("head", 0, ROWS)
    gpu.allocate(1, "compute workspace")  # PIECE + 1 used and PIECE cached: over 2 * PIECE
    assert (0, 0) not in cache and gpu.cached_bytes == 0
    gpu.free(1)
    store.release(staged)
    store.close()
