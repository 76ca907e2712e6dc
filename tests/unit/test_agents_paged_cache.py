"""PagedKVCache: attention over scattered blocks equals the dense cache; swaps move the data."""

import pytest
import torch

from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.models.config import ModelConfig
from offload.budget import BudgetExceededError, TierBudget

CFG = ModelConfig(arch="decoder", model_type="llama", vocab_size=32, hidden_size=32, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, intermediate_size=64, max_position=64)


def _qkv(n, t, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, t, 4, 8, generator=g), torch.randn(n, t, 2, 8, generator=g),
            torch.randn(n, t, 2, 8, generator=g))


def test_pool_bytes_equal_block_manager_count():
    cache = PagedKVCache(CFG, 10, 3, 4, torch.float32)
    per_token = CFG.kv_bytes_per_token(4)  # 2 x layers x kv heads x head dim x 4 bytes
    assert per_token == 2 * 2 * 2 * 8 * 4
    assert cache.gpu_pool_bytes == 10 * 4 * per_token
    assert cache.cpu_pool_bytes == 3 * 4 * per_token
    assert PagedKVCache.blocks_in(CFG, cache.gpu_pool_bytes + per_token, 4, torch.float32) == 10


def test_pools_are_charged_to_tier_budgets():
    block = 4 * CFG.kv_bytes_per_token(4)
    budgets = {"gpu": TierBudget("gpu", 10 * block), "cpu": TierBudget("cpu", 3 * block)}
    cache = PagedKVCache(CFG, 10, 3, 4, torch.float32, budgets=budgets)
    assert budgets["gpu"].used_bytes == cache.gpu_pool_bytes
    assert budgets["cpu"].used_bytes == cache.cpu_pool_bytes
    cache.release()
    assert budgets["gpu"].used_bytes == 0
    with pytest.raises(BudgetExceededError):
        PagedKVCache(CFG, 11, 0, 4, torch.float32, budgets=budgets)


def test_attention_over_scattered_blocks_matches_dense():
    bs = 4
    paged = PagedKVCache(CFG, 16, 0, bs, torch.float32)
    dense = DenseKVCache(CFG, 2, 32, torch.float32)
    tables = [[7, 2, 11, 0], [5, 14, 3]]  # out of order, interleaved between requests
    lengths = [13, 9]
    slots = paged.set_block_tables(tables)
    # prefill each request alone (chunks of different lengths), then decode both together
    for row, n in enumerate(lengths):
        q, k, v = _qkv(1, n, row)
        pos = torch.arange(n)[None]
        paged.set_block_tables([tables[row]])
        out_p = paged.attend(0, torch.tensor([0]), pos, q, k, v)
        out_d = dense.attend(0, torch.tensor([row]), pos, q, k, v)
        torch.testing.assert_close(out_p, out_d)
    slots = paged.set_block_tables(tables)
    q, k, v = _qkv(2, 1, 9)
    pos = torch.tensor([[lengths[0]], [lengths[1]]])
    torch.testing.assert_close(paged.attend(0, slots, pos, q, k, v), dense.attend(0, torch.tensor([0, 1]), pos, q, k, v))


def test_swap_out_and_in_round_trip_to_other_blocks():
    paged = PagedKVCache(CFG, 8, 4, 4, torch.float32)
    for layer in range(CFG.num_layers):
        paged.k[layer].normal_()
        paged.v[layer].normal_()
    before = [paged.k[layer][[1, 6]].clone() for layer in range(CFG.num_layers)]
    paged.swap_out([(1, 3), (6, 0)])
    paged.free_blocks([1, 6])
    assert all(bool((paged.k[layer][[1, 6]] == 0).all()) for layer in range(CFG.num_layers))
    paged.swap_in([(3, 2), (0, 5)])
    for layer in range(CFG.num_layers):
        torch.testing.assert_close(paged.k[layer][[2, 5]], before[layer])


def test_bad_sizes_are_rejected_with_the_numbers():
    with pytest.raises(ValueError, match="num_gpu_blocks > 0"):
        PagedKVCache(CFG, 0, 1, 4, torch.float32)


def test_a_padded_row_writes_its_real_tokens_only():
    """A one-token chunk fed as a two-column prompt step (`Step.lengths`): the pad's position starts
    a block the request does not own, and nothing is written there (the table's padding is block 0,
    another request's)."""
    bs = 4
    paged = PagedKVCache(CFG, 8, 0, bs, torch.float32)
    other = torch.randn(2, bs, 8)
    paged.k[0][0], paged.v[0][0] = other, other  # block 0: someone else's keys
    tables = [[3, 5], [6]]  # row 1 owns positions 0..3 only
    slots = paged.set_block_tables(tables)
    q, k, v = _qkv(2, 2, 4)
    pos = torch.tensor([[5, 6], [3, 4]])  # row 1: its last position, then a pad at 4 (block 1 of its table)
    geometry = paged.step_geometry(slots, pos, lengths=torch.tensor([2, 1]))
    out = paged.attend(0, slots, pos, q, k, v, geometry=geometry)
    assert torch.equal(paged.k[0][0], other) and torch.equal(paged.v[0][0], other)
    assert torch.equal(paged.k[0][6][:, 3], k[1, 0]) and torch.equal(paged.k[0][5][:, 2], k[0, 1])
    # the real query sees what an unpadded step shows it
    alone = paged.attend(0, slots[1:], pos[1:, :1], q[1:, :1], k[1:, :1], v[1:, :1])
    assert torch.equal(out[1, 0], alone[0, 0])
