"""A dense cache's shortcut writes (a decode at one shared position, a fresh prompt chunk) put the
same values where the indexed write puts them."""

import pytest
import torch

from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.models.config import ModelConfig

CFG = ModelConfig(arch="decoder", model_type="llama", vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=8, intermediate_size=64, max_position=64)


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
