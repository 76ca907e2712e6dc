"""A query's attention result on the CPU is bit-identical whatever else shares its step: other
rows (and the padded span their lengths make), the chunk it is computed in (decode, prompt
chunk, recompute), the block of queries a long chunk is cut into. See models.attention."""

import random

import pytest
import torch

from flexlamps.models import attention as attention_module
from flexlamps.models.attention import KEY_BLOCK, attention

# (head_dim, heads, kv_heads): SmolLM2, MHA, LLaMA-3-8B (4 of its 8 kv heads), small GQA, MQA
SHAPES = [(64, 9, 3), (64, 4, 4), (128, 16, 4), (16, 4, 2), (80, 8, 1)]


def _alone(q0, keys, values):
    """Query q0 (heads, d) decoded alone over its own keys (kv, p+1, d): no padding, no other row."""
    span = keys.shape[1]
    return attention(q0[None, :, None], keys[None], values[None], torch.ones(1, 1, span, dtype=torch.bool))[0, :, 0]


def _in_a_step(rnd, g, q0, keys, values, dtype):
    """The same query at a random place of a random step: n rows, a chunk of T queries, keys
    padded past its own by other rows; returns its result there."""
    heads, d = q0.shape
    kv, own = keys.shape[0], keys.shape[1]  # own = p + 1
    n = rnd.choice([1, 2, 5, 16] if heads * d <= 1024 else [1, 2, 5])
    t = min(own, rnd.choice([1, 1, 2, 3, 7, 40]))
    j = rnd.randrange(t)  # the query's index in its chunk
    span = own - j - 1 + t + rnd.choice([0, 1, 5, 17, KEY_BLOCK, 3 * KEY_BLOCK + 9])
    row = rnd.randrange(n)
    q = torch.randn(n, heads, t, d, generator=g).to(dtype)
    k = torch.randn(n, kv, span, d, generator=g).to(dtype)
    v = torch.randn(n, kv, span, d, generator=g).to(dtype)
    positions = torch.randint(0, span, (n, t), generator=g)
    q[row, :, j], k[row, :, :own], v[row, :, :own] = q0, keys, values
    positions[row] = torch.arange(own - 1 - j, own - 1 - j + t)
    mask = torch.arange(span)[None, None, :] <= positions[:, :, None]
    return attention(q, k, v, mask)[row, :, j]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}h{}kv{}".format(*s))
def test_query_result_does_not_depend_on_its_step(shape, dtype, monkeypatch):
    d, heads, kv = shape
    rnd, g = random.Random(sum(shape)), torch.Generator().manual_seed(sum(shape))
    for case in range(24):
        if case % 3 == 2:  # long chunks cut into blocks of a few queries
            monkeypatch.setattr(attention_module, "_SCORES_PER_BLOCK", rnd.choice([1, 4096, 50_000]))
        else:
            monkeypatch.undo()
        own = rnd.choice([1, 2, 9, 16, 17, KEY_BLOCK, KEY_BLOCK + 1, rnd.randrange(1, 400)])
        q0 = torch.randn(heads, d, generator=g).to(dtype)
        keys = torch.randn(kv, own, d, generator=g).to(dtype)
        values = torch.randn(kv, own, d, generator=g).to(dtype)
        assert torch.equal(_in_a_step(rnd, g, q0, keys, values, dtype), _alone(q0, keys, values)), (case, own)


def test_matches_plain_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 6, 5, 32, generator=g), torch.randn(3, 2, 300, 32, generator=g), torch.randn(3, 2, 300, 32, generator=g)
    mask = torch.rand(3, 5, 300, generator=g) < 0.7
    mask[..., 0] = True
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
    torch.testing.assert_close(attention(q, k, v, mask), ref, rtol=1e-5, atol=1e-6)
