"""MLA's products give a row the same bits whatever shares its step (`models.blocks.mla`): the
per-head products with W_UK and W_UV, the attention over latent entries and the indexer's
scores; each also equals the plain formula up to rounding."""

import random

import pytest
import torch

from flexlamps.models.blocks.attention import AttnOptions, attention
from flexlamps.models.blocks.mla import MLAStep, absorb_query, expand_values, index_scores, latent_attention

# (heads, nope, kv_lora_rank, rope, v): the tiny test models', DeepSeek-V2-Lite's (4 of its 16 heads)
SHAPES = [(4, 16, 32, 8, 16), (4, 128, 512, 64, 128)]
DTYPES = [torch.float32, torch.bfloat16]


def _place(rnd: random.Random, g: torch.Generator, row: torch.Tensor, dtype) -> tuple[torch.Tensor, int, int]:
    """`row` (T0, ...) as row r of a random step of n rows and T >= T0 tokens -> (step, r)."""
    n, extra = rnd.choice([1, 2, 3, 5, 9]), rnd.choice([0, 0, 1, 3, 30])
    step = torch.randn(n, row.shape[0] + extra, *row.shape[1:], generator=g).to(dtype)
    r = rnd.randrange(n)
    step[r, :row.shape[0]] = row
    return step, r


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}nope{}R{}r{}v{}".format(*s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_head_products_do_not_depend_on_the_rows_beside(shape, dtype):
    heads, nope, rank, _, v = shape
    rnd, g = random.Random(heads + nope), torch.Generator().manual_seed(nope)
    w_uk = torch.randn(heads, nope, rank, generator=g).to(dtype) / nope ** 0.5
    w_uv = torch.randn(heads, v, rank, generator=g).to(dtype) / rank ** 0.5
    for case in range(12):
        tokens = rnd.choice([1, 2, 3, 7])
        q_nope = torch.randn(1, tokens, heads, nope, generator=g).to(dtype)  # (1, T, H, nope)
        alone = absorb_query(q_nope, w_uk)  # (1, H, T, R)
        torch.testing.assert_close(alone, torch.matmul(q_nope.transpose(1, 2), w_uk))
        step, r = _place(rnd, g, q_nope[0], dtype)
        assert torch.equal(absorb_query(step, w_uk)[r, :, :tokens], alone[0]), case
        attended = torch.randn(1, heads, tokens, rank, generator=g).to(dtype)
        out = expand_values(attended, w_uv)  # (1, T, H * v)
        torch.testing.assert_close(out, torch.matmul(attended, w_uv.transpose(1, 2)).transpose(1, 2).flatten(2))
        step, r = _place(rnd, g, attended[0].transpose(0, 1), dtype)  # (n, T', H, R)
        assert torch.equal(expand_values(step.transpose(1, 2), w_uv)[r, :tokens], out[0]), case


def _latent_step(g, n, heads, t, rank, rope, dtype, **index) -> MLAStep:
    return MLAStep(q_latent=torch.randn(n, heads, t, rank, generator=g).to(dtype),
                   q_rope=torch.randn(n, heads, t, rope, generator=g).to(dtype),
                   latent=torch.empty(0), k_rope=torch.empty(0), softmax_scale=0.1, **index)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}nope{}R{}r{}v{}".format(*s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_query_attends_the_same_bits_in_any_step(shape, dtype):
    """A decode query over its p + 1 entries, alone vs in a step of other rows, a chunk of other
    queries and entries padded past its own."""
    heads, _, rank, rope, _ = shape
    rnd, g = random.Random(rank), torch.Generator().manual_seed(rank)
    for case in range(12):
        own = rnd.choice([1, 5, 16, 17, 129, rnd.randrange(1, 300)])
        query = _latent_step(g, 1, heads, 1, rank, rope, dtype)
        entries = torch.randn(1, own, rank + rope, generator=g).to(dtype)
        alone = latent_attention(query, entries, torch.ones(1, 1, own, dtype=torch.bool))[0, :, 0]
        n, t, pad = rnd.choice([1, 2, 5]), rnd.choice([1, 1, 3, 9]), rnd.choice([0, 1, 20, 130])
        step = _latent_step(g, n, heads, t, rank, rope, dtype)
        span, r, j = own + pad, rnd.randrange(n), rnd.randrange(t)
        table = torch.randn(n, span, rank + rope, generator=g).to(dtype)
        step.q_latent[r, :, j], step.q_rope[r, :, j] = query.q_latent[0, :, 0], query.q_rope[0, :, 0]
        table[r, :own] = entries[0]
        keep = torch.rand(n, t, span, generator=g) < 0.7
        keep[r, j] = torch.arange(span) < own
        assert torch.equal(latent_attention(step, table, keep)[r, :, j], alone), case


def test_latent_attention_is_absorbed_softmax_attention():
    """Scores q_latent . latent + q_rope . k_rope, softmax, the weighted sum of latents."""
    g = torch.Generator().manual_seed(3)
    step = _latent_step(g, 2, 4, 3, 32, 8, torch.float32)
    entries = torch.randn(2, 20, 40, generator=g)
    keep = torch.rand(2, 3, 20, generator=g) < 0.6
    keep[..., 0] = True
    latent, k_rope = entries.split([32, 8], dim=-1)
    scores = (step.q_latent @ latent[:, None].transpose(-1, -2) + step.q_rope @ k_rope[:, None].transpose(-1, -2))
    probs = (scores * step.softmax_scale).masked_fill(~keep[:, None], float("-inf")).softmax(-1)
    torch.testing.assert_close(latent_attention(step, entries, keep), probs @ latent[:, None])


def test_values_viewing_the_keys_give_the_bits_of_a_copy():
    """attention's one fp32 conversion of keys whose first columns are the values (MLA's entries)."""
    g = torch.Generator().manual_seed(4)
    q, keys = torch.randn(2, 4, 3, 40, generator=g).bfloat16(), torch.randn(2, 1, 150, 40, generator=g).bfloat16()
    mask = torch.rand(2, 3, 150, generator=g) < 0.8
    opts = AttnOptions(scale=0.2)
    assert torch.equal(attention(q, keys, keys[..., :32], mask, opts),
                       attention(q, keys, keys[..., :32].clone(), mask, opts))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_scores_do_not_depend_on_the_step(dtype):
    """The lightning indexer's scores of a query against its keys, alone vs in any step."""
    rnd, g = random.Random(5), torch.Generator().manual_seed(5)
    heads, dim = 16, 16
    for case in range(12):
        own = rnd.choice([1, 3, 8, 40])
        q, w = torch.randn(1, 1, heads, dim, generator=g).to(dtype), torch.randn(1, 1, heads, generator=g)
        keys = torch.randn(1, own, dim, generator=g).to(dtype)
        alone = index_scores(MLAStep(*[torch.empty(0)] * 4, 0.1, index_q=q, index_w=w), keys)[0, 0]
        n, t, pad = rnd.choice([1, 2, 5]), rnd.choice([1, 1, 4]), rnd.choice([0, 2, 50])
        qs, ws = torch.randn(n, t, heads, dim, generator=g).to(dtype), torch.randn(n, t, heads, generator=g)
        table = torch.randn(n, own + pad, dim, generator=g).to(dtype)
        r, j = rnd.randrange(n), rnd.randrange(t)
        qs[r, j], ws[r, j], table[r, :own] = q[0, 0], w[0, 0], keys[0]
        got = index_scores(MLAStep(*[torch.empty(0)] * 4, 0.1, index_q=qs, index_w=ws), table)[r, j, :own]
        assert torch.equal(got, alone), case
