"""RoPE: the per-step tables and the four-op rotation equal the reference rotation bit for bit."""

import pytest
import torch

from flexlamps.models.blocks.rope import apply_rope, rope_cos_sin, rope_tables, rotate_half_split


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotate_half_split_equals_apply_rope(dtype):
    gen = torch.Generator().manual_seed(0)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    positions = torch.randint(0, 4000, (3, 5), generator=gen)
    # q and k of one stacked projection: strided views of one (n, T, heads, d) tensor
    qkv = (torch.randn(3, 5, 7, 16, generator=gen) * 4).to(dtype)
    qk = qkv[:, :, :6]
    cos, sin = rope_cos_sin(inv_freq, positions, dtype)
    got = rotate_half_split(qk, *rope_tables(inv_freq, positions, dtype))
    assert torch.equal(got, apply_rope(qk, cos, sin))
    assert torch.equal(got[:, :, 4:], apply_rope(qk[:, :, 4:], cos, sin))
