"""A dense cache's shortcut writes (a decode at one shared position, a fresh prompt chunk) put the
same values where the indexed write puts them."""

import pytest
import torch

from flexlamps.engine.caches.dense import DenseKVCache, held_dtype, zeroed
from flexlamps.models.config import ModelConfig

CFG = ModelConfig(arch="decoder", model_type="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=8, intermediate_size=64, max_position=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_new_cache_is_zeros_where_the_allocator_hands_back_used_memory(dtype):
    for _ in range(3):  # blocks of the cache's size, dirtied and freed: the next ones may reuse them
        torch.full((CFG.num_kv_heads, 40000), float("nan"), dtype=dtype).neg_()
    cache = DenseKVCache(CFG, 3, 5000, dtype)
    for t in cache.k + cache.v:
        assert t.dtype == held_dtype(dtype, "cpu") and t.shape == (3, CFG.num_kv_heads, 5000, CFG.head_dim)
        assert torch.equal(t, torch.zeros_like(t)) and not t.signbit().any()  # +0.0, torch.zeros' bits
    assert torch.equal(zeroed((2, 3), dtype, "cpu"), torch.zeros(2, 3, dtype=dtype))


def _indexed(slots, positions, k):
    """What `cache[slots[:, None], :, positions] = k` leaves in a fresh cache of 4 rows."""
    out = torch.zeros(4, CFG.num_kv_heads, 16, CFG.head_dim)
    out[slots[:, None], :, positions] = k
    return out


@pytest.mark.parametrize("slots, positions", [
    ([2], [[9]]),  # batch-1 decode: the shortcut
    ([1, 2, 3], [[5], [5], [5]]),  # a block of rows at one position: the shortcut
    ([1, 2, 3], [[5], [7], [5]]),  # positions differ: the indexed write
    ([3, 0], [[4], [4]]),  # not a block: the indexed write
])
def test_decode_writes_equal_the_indexed_write(slots, positions):
    slots, positions = torch.tensor(slots), torch.tensor(positions)
    cache = DenseKVCache(CFG, 4, 16, torch.float32)
    geo = cache.step_geometry(slots, positions)
    assert (geo.decode_at is not None) == (len(set(positions.flatten().tolist())) == 1 and geo.first is not None)
    gen = torch.Generator().manual_seed(0)
    n, heads, kv, d = len(slots), CFG.num_heads, CFG.num_kv_heads, CFG.head_dim
    q, k, v = (torch.randn(n, 1, h, d, generator=gen) for h in (heads, kv, kv))
    cache.attend(0, slots, positions, q, k, v, geo)
    assert torch.equal(cache.k[0], _indexed(slots, positions, k)) and torch.equal(cache.v[0], _indexed(slots, positions, v))
