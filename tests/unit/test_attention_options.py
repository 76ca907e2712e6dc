"""AttnOptions (scale, soft-capping, sliding window, sinks) as the formulas transformers writes, and
honoured alike by every cache path: dense, paged, tiered (gpu and cpu tiers), packed segments."""

import pytest
import torch

from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.engine.caches.segments import segment_attention
from flexlamps.engine.caches.tiered import TieredKVCache
from flexlamps.engine.executors.step import SegmentGroup, Segments
from flexlamps.models.blocks.attention import AttnOptions, attention, visible_keys
from flexlamps.models.config import ModelConfig
from offload.budget import TierBudget

HEADS, KV, D = 4, 2, 16


def _reference(q, k, v, positions, opts: AttnOptions):
    """transformers' eager attention (gemma2's soft-capping, gpt-oss's sinks) with its sliding
    window mask, in float64: q (n, heads, T, d), k/v (n, kv, S, d), positions (n, T)."""
    q, k, v = q.double(), k.double().repeat_interleave(HEADS // KV, 1), v.double().repeat_interleave(HEADS // KV, 1)
    scores = q @ k.transpose(-1, -2) * opts.scale_for(q.shape[-1])
    if opts.softcap is not None:
        scores = torch.tanh(scores / opts.softcap) * opts.softcap
    mask = visible_keys(k.shape[2], positions, opts.window)[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    if opts.sinks is not None:
        sinks = opts.sinks.double()[None, :, None, None].expand(*scores.shape[:3], 1)
        return torch.softmax(torch.cat([scores, sinks], -1), -1)[..., :-1] @ v
    return torch.softmax(scores, -1) @ v


OPTIONS = {
    "plain": AttnOptions(),
    "scale": AttnOptions(scale=0.11),
    "softcap": AttnOptions(scale=0.2, softcap=1.5),
    "window": AttnOptions(window=5),
    "sinks": AttnOptions(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0])),
    "all": AttnOptions(scale=0.3, softcap=2.0, window=3, sinks=torch.tensor([1.0, 0.0, -2.0, 3.0])),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_attention_is_transformers_formula(name):
    g = torch.Generator().manual_seed(0)
    opts = OPTIONS[name]
    q, k, v = torch.randn(2, HEADS, 7, D, generator=g), torch.randn(2, KV, 20, D, generator=g), \
        torch.randn(2, KV, 20, D, generator=g)
    positions = torch.tensor([list(range(13, 20)), list(range(3, 10))])
    got = attention(q, k, v, visible_keys(20, positions, opts.window), opts)
    assert (got.double() - _reference(q, k, v, positions, opts)).abs().max().item() <= 1e-5


def test_window_masks_as_transformers_does():
    mask = visible_keys(6, torch.tensor([[5, 2]]), window=3)
    assert mask[0, 0].tolist() == [False, False, False, True, True, True]
    assert mask[0, 1].tolist() == [True, True, True, False, False, False]


def _cfg() -> ModelConfig:
    return ModelConfig(arch="decoder", model_type="llama", vocab_size=8, hidden_size=HEADS * D, num_layers=1,
                       num_heads=HEADS, num_kv_heads=KV, head_dim=D, intermediate_size=8, max_position=64)


def _caches(cfg, rows, capacity):
    budgets = {t: TierBudget(t, 1 << 30) for t in ("gpu", "cpu")}
    paged = PagedKVCache(cfg, rows * 8, 0, 4, torch.float32)
    paged.set_block_tables([list(range(r * 8, r * 8 + 8)) for r in range(rows)])
    return {"dense": DenseKVCache(cfg, rows, capacity, torch.float32), "paged": paged,
            "tiered_gpu": TieredKVCache(cfg, rows, capacity, torch.float32, ["gpu"], budgets, torch.device("cpu")),
            "tiered_cpu": TieredKVCache(cfg, rows, capacity, torch.float32, ["cpu"], budgets, torch.device("cpu"),
                                        cpu_attention=True)}


@pytest.mark.parametrize("name", ["window", "all"])
def test_every_cache_honours_the_options_over_prefill_and_decode(name):
    """A prompt chunk then decode steps: every cache gives the same bits, and the formula's values."""
    opts, cfg, g = OPTIONS[name], _cfg(), torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 12, HEADS, D, generator=g), torch.randn(2, 12, KV, D, generator=g), \
        torch.randn(2, 12, KV, D, generator=g)
    slots = torch.arange(2)
    outs = {}
    for kind, cache in _caches(cfg, 2, 16).items():
        steps = [(0, 6)] + [(t, t + 1) for t in range(6, 12)]
        parts = [cache.attend_fn(0, slots, torch.arange(a, b).expand(2, b - a))(
            q[:, a:b], k[:, a:b], v[:, a:b], opts) for a, b in steps]
        outs[kind] = torch.cat(parts, dim=1)
    for kind, out in outs.items():
        assert torch.equal(out, outs["dense"]), kind
    ref = _reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), torch.arange(12).expand(2, 12), opts)
    assert (outs["dense"].double() - ref.transpose(1, 2).reshape(2, 12, -1)).abs().max().item() <= 1e-5


def test_packed_segment_window_equals_the_sequence_alone():
    """A segment's window is cut by its own sequence's positions, not the packed row's."""
    opts, g = OPTIONS["all"], torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 9, HEADS, D, generator=g), torch.randn(1, 9, KV, D, generator=g), \
        torch.randn(1, 9, KV, D, generator=g)
    # row: a root of 4 tokens, then a question of 3 (its positions 4..6), then one of 2 (4..5)
    seg_a = ([4, 5, 6], [0, 1, 2, 3, 4, 5, 6])
    seg_b = ([7, 8], [0, 1, 2, 3, 7, 8])
    groups = []
    for queries, keys in (seg_a, seg_b):
        seen = torch.arange(len(keys) - len(queries) + 1, len(keys) + 1)
        mask = torch.arange(len(keys))[None, None, :] < seen[None, :, None]
        valid = torch.ones(1, len(queries), dtype=torch.bool)
        groups.append(SegmentGroup(torch.tensor([0]), torch.tensor([queries]), valid, torch.tensor([keys]), mask))
    keys, values = k.transpose(1, 2), v.transpose(1, 2)
    out = segment_attention(q, keys, values, Segments(tuple(groups), 9), opts)
    for queries, key_at in (seg_a, seg_b):
        own = len(key_at)
        positions = torch.arange(own - len(queries), own)[None]
        alone = attention(q[:, queries].transpose(1, 2), keys[:, :, key_at], values[:, :, key_at],
                          visible_keys(own, positions, opts.window), opts).transpose(1, 2)
        assert torch.equal(out[:, queries], alone)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="window"):
        AttnOptions(window=0)
    with pytest.raises(ValueError, match="softcap"):
        AttnOptions(softcap=-1.0)
