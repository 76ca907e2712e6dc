"""Sliding-window layers as rings (engine.caches.window): a ring layer's attention is the whole
row's masked attention bit for bit (windows shorter and longer than a key block, prompt chunks
longer than the window, padded rows, rows at other positions, decode far past the window), in
the dense and the tiered cache on every tier; its bytes stop growing at the window; rows fed
from where the ring no longer reaches are refused."""

import pytest
import torch

from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.engine.caches.tiered import TieredKVCache
from flexlamps.models.blocks.attention import BF16_TOLERANCE, AttnOptions, native_attention_kernel
from flexlamps.models.config import ModelConfig
from flexlamps.models.layer_config import AttentionConfig
from offload.budget import TierBudget

HEADS, KV, D, ROWS, CAPACITY = 4, 2, 8, 2, 520


def _cfg(window: int | None, layers: int = 1, slides: tuple[bool, ...] = ()) -> ModelConfig:
    return ModelConfig(arch="decoder", model_type="mistral", vocab_size=8, hidden_size=HEADS * D, num_layers=layers,
                       num_heads=HEADS, num_kv_heads=KV, head_dim=D, intermediate_size=8, max_position=CAPACITY,
                       attention=AttentionConfig(window=window, window_layers=slides))


def _budgets():
    return {t: TierBudget(t, 1 << 30) for t in ("gpu", "cpu")}


def _caches(window: int, dtype: torch.dtype = torch.float32) -> dict:
    cfg, cpu = _cfg(window), torch.device("cpu")
    return {"dense": DenseKVCache(cfg, ROWS, CAPACITY, dtype),
            "tiered_gpu": TieredKVCache(cfg, ROWS, CAPACITY, dtype, ["gpu"], _budgets(), cpu),
            "tiered_cpu_staged": TieredKVCache(cfg, ROWS, CAPACITY, dtype, ["cpu"], _budgets(), cpu),
            "tiered_cpu_attention": TieredKVCache(cfg, ROWS, CAPACITY, dtype, ["cpu"], _budgets(), cpu,
                                                  cpu_attention=True)}


def _steps(padded: bool = True):
    """(slots, first positions, tokens, real lengths or None): a prompt group (padded, or not: a
    paged cache's steps never are), chunks longer than the windows, decodes of rows at different
    positions, a chunk of both at different places."""
    steps = [([0, 1], [0, 0], 150, [150, 100] if padded else None), ([0], [150], 70, None)]
    steps += [([1], [100], 70, None)] if padded else [([1], [150], 20, None)]
    steps += [([0, 1], [220 + i, 170 + i], 1, None) for i in range(200)]
    return steps + [([0, 1], [420, 370], 9, None), ([1], [379], 1, None)]


def _run(cache, steps, qkv, opts):
    """Each step's attention output through `cache` (one layer, geometry once per step)."""
    outs = []
    for slots, starts, t, lengths in steps:
        slots = torch.tensor(slots)
        positions = torch.tensor(starts)[:, None] + torch.arange(t)
        q, k, v = (x[slots[:, None], positions] for x in qkv)
        if isinstance(cache, PagedKVCache):  # each row's blocks: a ring of ring_blocks
            rows = cache.set_block_tables([[r * cache.ring_blocks + b for b in range(cache.ring_blocks)]
                                           for r in slots.tolist()])
            outs.append(cache.attend_fn(0, rows, positions)(q, k, v, opts))
            continue
        geo = cache.step_geometry(slots, positions, lengths=None if lengths is None else torch.tensor(lengths))
        outs.append(cache.attend_fn(0, slots, positions, geometry=geo)(q, k, v, opts))
    return outs


@pytest.mark.parametrize("window", [7, 128, 130])
def test_rings_give_the_whole_rows_masked_attention_bit_for_bit(window):
    g = torch.Generator().manual_seed(window)
    qkv = [torch.randn(ROWS, CAPACITY, h, D, generator=g) for h in (HEADS, KV, KV)]
    opts = AttnOptions(window=window)
    whole = DenseKVCache(_cfg(None), ROWS, CAPACITY, torch.float32)  # today's path: the row, masked
    expected = _run(whole, _steps(), qkv, opts)
    for kind, cache in _caches(window).items():
        assert cache.k[0].shape[2] == window, kind  # a ring, not the capacity
        got = _run(cache, _steps(), qkv, opts)
        for i, (a, b) in enumerate(zip(got, expected)):
            assert torch.equal(a, b), f"{kind}, step {i}"


@pytest.mark.parametrize("window", [7, 130])
def test_half_precision_rings(window):
    """float16 (exact fp32 attention on a CPU without the AVX-512 kernel): the whole row's bits.
    bfloat16 (torch's flash kernel, whose result moves with a step's shapes: blocks.attention), and
    both where the AVX-512 kernel runs them: the dense and every tiered ring give one another's
    bits and stay within BF16_TOLERANCE of the whole row."""
    g = torch.Generator().manual_seed(window)
    base = [torch.randn(ROWS, CAPACITY, h, D, generator=g) for h in (HEADS, KV, KV)]
    opts = AttnOptions(window=window)
    for dtype in (torch.float16, torch.bfloat16):
        qkv = [x.to(dtype) for x in base]
        whole = _run(DenseKVCache(_cfg(None), ROWS, CAPACITY, dtype), _steps(), qkv, opts)
        rings = {kind: _run(cache, _steps(), qkv, opts) for kind, cache in _caches(window, dtype).items()}
        for kind, got in rings.items():
            assert all(torch.equal(a, b) for a, b in zip(got, rings["dense"])), kind
        largest = max(x.abs().max().item() for x in base[2:])  # the values attended over
        for i, (a, b) in enumerate(zip(rings["dense"], whole)):
            if dtype == torch.float16 and native_attention_kernel() is None:
                assert torch.equal(a, b), f"float16 step {i}"
            else:
                assert (a.float() - b.float()).abs().max().item() <= BF16_TOLERANCE * largest, f"bf16 step {i}"


def test_a_window_layers_bytes_stop_growing_at_its_window():
    """Every other layer slides (gemma2's pattern): its cache row holds 16 positions whatever the
    capacity, in memory and on the tiers the offload engine charges; the full layers grow."""
    cfg = _cfg(16, layers=2, slides=(True, False))
    per_token = 2 * KV * D * 4  # K and V, float32
    for capacity in (8, 16, 64, 4096):
        dense = DenseKVCache(cfg, 1, capacity, torch.float32)
        budgets = _budgets()
        tiered = TieredKVCache(cfg, 1, capacity, torch.float32, ["cpu", "gpu"], budgets, torch.device("cpu"))
        layer_bytes = [k.nbytes + v.nbytes for k, v in zip(dense.k, dense.v)]
        assert layer_bytes == [min(capacity, 16) * per_token, capacity * per_token]
        assert budgets["cpu"].used_bytes == layer_bytes[0] and budgets["gpu"].used_bytes == layer_bytes[1]
        tiered.release()


def test_a_step_the_ring_no_longer_reaches_is_refused():
    window = 7
    cache = DenseKVCache(_cfg(window), 1, 64, torch.float32)
    qkv = [torch.randn(1, 64, h, D) for h in (HEADS, KV, KV)]
    opts = AttnOptions(window=window)
    _run(cache, [([0], [0], 20, None)], qkv, opts)
    _run(cache, [([0], [19], 1, None)], qkv, opts)  # the last token again: the ring still holds 13..18
    with pytest.raises(ValueError, match="no longer holds"):
        _run(cache, [([0], [10], 1, None)], qkv, opts)
    with pytest.raises(ValueError, match="no longer holds"):
        _run(cache, [([0], [30], 1, None)], qkv, opts)  # a gap: positions 20..29 were never written
    _run(cache, [([0], [0], 3, None)], qkv, opts)  # a new sequence in the row
    with pytest.raises(ValueError, match="window"):  # the layer must attend with the ring's window
        _run(cache, [([0], [3], 1, None)], qkv, AttnOptions(window=9))


@pytest.mark.parametrize("kind", ["dense", "tiered_cpu_staged"])
def test_a_prefix_longer_than_the_window_copied_into_rings(kind):
    """A 150-token prefix computed once in a one-row cache (ring 130), copied into both rows of a
    larger cache, then each row's own tokens: the bits of computing every row whole."""
    window, g = 130, torch.Generator().manual_seed(3)
    qkv = [torch.randn(ROWS, CAPACITY, h, D, generator=g) for h in (HEADS, KV, KV)]
    for x in qkv:
        x[1, :150] = x[0, :150]  # the shared prefix
    opts = AttnOptions(window=window)
    tail = [([0, 1], [150, 150], 40, [40, 25])] + [([0, 1], [190 + i, 175 + i], 1, None) for i in range(150)]
    whole = DenseKVCache(_cfg(None), ROWS, CAPACITY, torch.float32)
    expected = _run(whole, [([0, 1], [0, 0], 150, None)] + tail, qkv, opts)[1:]
    prefix, cache = DenseKVCache(_cfg(window), 1, 150, torch.float32), _caches(window)[kind]
    _run(prefix, [([0], [0], 150, None)], qkv, opts)
    cache.copy_prefix_from(prefix, 150, torch.tensor([0, 1]))
    for i, (a, b) in enumerate(zip(_run(cache, tail, qkv, opts), expected)):
        assert torch.equal(a, b), f"step {i}"


@pytest.mark.parametrize("window, block_size", [(7, 4), (130, 16), (128, 16)])
def test_paged_rings_of_blocks_give_the_whole_rows_bits(window, block_size):
    """Every layer slides: a request keeps ceil(window / block_size) blocks, a ring of whole blocks."""
    g = torch.Generator().manual_seed(window)
    qkv = [torch.randn(ROWS, CAPACITY, h, D, generator=g) for h in (HEADS, KV, KV)]
    opts = AttnOptions(window=window)
    expected = _run(DenseKVCache(_cfg(None), ROWS, CAPACITY, torch.float32), _steps(padded=False), qkv, opts)
    ring_blocks = -(-window // block_size)
    paged = PagedKVCache(_cfg(window), ROWS * ring_blocks, 0, block_size, torch.float32)
    assert paged.ring_blocks == ring_blocks
    for i, (a, b) in enumerate(zip(_run(paged, _steps(padded=False), qkv, opts), expected)):
        assert torch.equal(a, b), f"step {i}"
    mixed = PagedKVCache(_cfg(window, layers=2, slides=(True, False)), 4, 0, block_size, torch.float32)
    assert mixed.ring_blocks is None  # a full-attention layer reads every block
