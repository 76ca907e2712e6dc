"""A query's float32 attention result on the CPU is bit-identical whatever else shares its step:
other rows (and the padded span their lengths make), the chunk it is computed in (decode, prompt
chunk, recompute), the block of queries a long chunk is cut into. In bf16 it is fixed for a given
step and within `BF16_TOLERANCE` (of the largest |value|) of float32's and of itself in any other
step. See models.attention."""

import random

import pytest
import torch

from placement import attention_scratch

from flexlamps.models.blocks.attention import BF16_TOLERANCE, KEY_BLOCK, AttnOptions, attention

# (head_dim, heads, kv_heads): SmolLM2, MHA, LLaMA-3-8B (4 of its 8 kv heads), small GQA, MQA
SHAPES = [(64, 9, 3), (64, 4, 4), (128, 16, 4), (16, 4, 2), (80, 8, 1)]


def _alone(q0, keys, values, opts=None):
    """Query q0 (heads, d) decoded alone over its own keys (kv, p+1, d): no padding, no other row."""
    span = keys.shape[1]
    mask = torch.ones(1, 1, span, dtype=torch.bool)
    return attention(q0[None, :, None], keys[None], values[None], mask, opts)[0, :, 0]


def _in_a_step(rnd, g, q0, keys, values, dtype, opts=None):
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
    return attention(q, k, v, mask, opts)[row, :, j]


def _cases(shape, dtype, monkeypatch, count, options=lambda heads, g: None):
    """(query result in a random step, alone, float32 alone) for `count` random queries."""
    d, heads, kv = shape
    rnd, g = random.Random(sum(shape)), torch.Generator().manual_seed(sum(shape))
    for case in range(count):
        if case % 3 == 2:  # long chunks cut into blocks of a few queries
            monkeypatch.setattr(attention_scratch, "SCORES_PER_BLOCK", rnd.choice([1, 4096, 50_000]))
        else:
            monkeypatch.undo()
        own = rnd.choice([1, 2, 9, 16, 17, KEY_BLOCK, KEY_BLOCK + 1, rnd.randrange(1, 400)])
        q0 = torch.randn(heads, d, generator=g)
        keys, values = torch.randn(kv, own, d, generator=g), torch.randn(kv, own, d, generator=g)
        opts = options(heads, g)
        in_step = _in_a_step(rnd, g, q0.to(dtype), keys.to(dtype), values.to(dtype), dtype, opts)
        alone = _alone(q0.to(dtype), keys.to(dtype), values.to(dtype), opts)
        exact = _alone(*(x.to(dtype).float() for x in (q0, keys, values)), opts)
        yield in_step, alone, exact, values.to(dtype).float().abs().max()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}h{}kv{}".format(*s))
def test_query_result_does_not_depend_on_its_step(shape, monkeypatch):
    for case, (in_step, alone, _, _) in enumerate(_cases(shape, torch.float32, monkeypatch, 24)):
        assert torch.equal(in_step, alone), case


def _soft_capped_with_sinks(heads, g):
    return AttnOptions(scale=0.3, softcap=_softcap(g), sinks=torch.randn(heads, generator=g))


def _softcap(g) -> float:
    return float(torch.rand(1, generator=g)) * 5 + 0.5


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}h{}kv{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_options_keep_a_query_independent_of_its_step(shape, dtype, monkeypatch):
    """Scale, soft-capping and sinks run on the exact path: the same bits in any step."""
    for case, (in_step, alone, _, _) in enumerate(_cases(shape, dtype, monkeypatch, 12, _soft_capped_with_sinks)):
        assert torch.equal(in_step, alone), case


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}h{}kv{}".format(*s))
def test_bf16_result_is_within_its_bound_of_float32_and_of_other_steps(shape, monkeypatch):
    for case, (in_step, alone, exact, scale) in enumerate(_cases(shape, torch.bfloat16, monkeypatch, 24)):
        bound = BF16_TOLERANCE * scale
        assert (in_step.float() - alone.float()).abs().max() <= bound, case
        assert (alone.float() - exact).abs().max() <= bound, case


def test_bf16_result_is_fixed_for_a_step_and_the_bound_catches_a_wrong_key():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 9, 1, 64, generator=g).bfloat16()
    k, v = torch.randn(4, 3, 40, 64, generator=g).bfloat16(), torch.randn(4, 3, 40, 64, generator=g).bfloat16()
    mask = torch.arange(40)[None, None, :] <= torch.tensor([10, 20, 30, 39])[:, None, None]
    out = attention(q, k, v, mask)
    assert torch.equal(out, attention(q.clone(), k.clone(), v.clone(), mask.clone()))
    wrong = mask.clone()
    wrong[:, :, 0] = False  # one key dropped: far outside the bound
    assert (attention(q, k, v, wrong).float() - out.float()).abs().max() > 4 * BF16_TOLERANCE * v.float().abs().max()


def test_matches_plain_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 6, 5, 32, generator=g), torch.randn(3, 2, 300, 32, generator=g), torch.randn(3, 2, 300, 32, generator=g)
    mask = torch.rand(3, 5, 300, generator=g) < 0.7
    mask[..., 0] = True
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
    torch.testing.assert_close(attention(q, k, v, mask), ref, rtol=1e-5, atol=1e-6)
