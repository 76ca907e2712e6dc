"""The compressed KV rows the engine's caches use: per-channel keys (appends, decode steps,
truncation, prefix copies) and per-token values (within half a step, prefix copies)."""

import torch

from quant import KV_CACHE_DEFAULT, QuantConfig
from quant.kv_rows import ChannelGroupedRows, TokenGroupedRows

G8 = QuantConfig(bits=4, group_size=8, group_dim=-2)


def _roundtrip_bound(x: torch.Tensor, g: int) -> torch.Tensor:
    """Half a quantization step per (channel, block of g tokens), broadcast per token."""
    h, t, d = x.shape
    blocks = x[:, : t // g * g].reshape(h, t // g, g, d)
    step = (blocks.amax(2) - blocks.amin(2)) / 15
    return (step / 2 + 1e-5).repeat_interleave(g, dim=1)


def test_chunked_and_decode_writes_read_back_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    keys = ChannelGroupedRows((2, 3, 200, 16), torch.float32, "cpu", G8)
    x = torch.randn(2, 70, 3, 16, generator=g) * torch.linspace(0.1, 10, 16)  # outlier channels
    keys.write(torch.tensor([0, 1]), torch.arange(50).expand(2, 50), x[:, :50])
    for p in range(50, 70):  # decode steps
        keys.write(torch.tensor([0, 1]), torch.tensor([[p], [p]]), x[:, p:p + 1])
    out = keys.read(torch.tensor([0, 1]), 70)
    for r in range(2):
        ref = x[r].transpose(0, 1)  # (heads, T, d)
        full = 64
        assert ((out[r, :, :full] - ref[:, :full]).abs() <= _roundtrip_bound(ref, 8)[:, :full]).all()
        assert torch.equal(out[r, :, full:70], ref[:, full:70])  # the residual stays exact


def test_rewrite_after_padding_truncates_and_reopens_a_block():
    keys = ChannelGroupedRows((1, 1, 64, 4), torch.float32, "cpu", G8)
    x = torch.randn(1, 20, 1, 4)
    keys.write(torch.tensor([0]), torch.arange(20)[None], x)  # 20 tokens: blocks 0, 1 full, 4 in residual
    fresh = torch.randn(1, 1, 1, 4)
    keys.write(torch.tensor([0]), torch.tensor([[11]]), fresh)  # decode overwrites padding from 11 on
    assert keys.lengths[0] == 12
    out = keys.read(torch.tensor([0]), 12)
    assert torch.equal(out[0, :, 11], fresh[0, 0])
    assert (out[0, :, 8:11] - x[0, 8:11].transpose(0, 1)).abs().max() < 0.5


def test_copy_prefix_from_matches_source():
    src = ChannelGroupedRows((1, 2, 64, 4), torch.float32, "cpu", G8)
    x = torch.randn(1, 21, 2, 4)
    src.write(torch.tensor([0]), torch.arange(21)[None], x)
    dst = ChannelGroupedRows((3, 2, 64, 4), torch.float32, "cpu", G8)
    dst.copy_prefix_from(src, 19, torch.tensor([1, 2]))
    a = src.read(torch.tensor([0]), 19)
    b = dst.read(torch.tensor([1, 2]), 19)
    assert torch.allclose(b, a.expand(2, -1, -1, -1), atol=1e-6)


def test_token_grouped_values_read_back_within_half_a_step_and_copy_prefixes():
    g = torch.Generator().manual_seed(1)
    rows = TokenGroupedRows((3, 2, 32, 64), torch.float32, "cpu", KV_CACHE_DEFAULT)
    x = torch.randn(2, 20, 2, 64, generator=g)
    rows.write(torch.tensor([0, 2]), torch.arange(20).expand(2, 20), x)
    out = rows.read(torch.tensor([0, 2]), 20)  # (n, heads, span, d)
    ref = x.transpose(1, 2)
    groups = ref.reshape(2, 2, 20, 1, 64)  # one group of 64 per token and head
    half_step = ((groups.amax(-1) - groups.amin(-1)) / 15 / 2 + 1e-5)
    assert ((out - ref).abs() <= half_step).all()
    rows.copy_prefix_from(rows, 12, torch.tensor([1]))  # row 0's first 12 positions into row 1
    assert torch.equal(rows.read(torch.tensor([1]), 12), out[:1, :, :12])


def test_the_planner_prices_the_key_layout_the_engine_runs():
    from placement.specs import CACHE_KEY_GROUP_TOKENS
    from quant import KV_KEYS_PER_CHANNEL

    assert KV_KEYS_PER_CHANNEL.group_size == CACHE_KEY_GROUP_TOKENS
