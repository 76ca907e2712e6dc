"""The bf16 / fp16 attention (flexlamps/kernels/attention.c), in every variant this CPU has: its arithmetic (fp32
scores, exp(score - max) rounded to the dtype, fp32 sums divided by the weights' sum, one
rounding) against the same computed by torch, within the bf16 bound of float32, for decodes and
causal prompt chunks; a query's result independent of the other rows and positions, the padded
span and the thread count; what it refuses; and how it is loaded."""

import os

import pytest
import torch

from flexlamps.models.blocks import attention as attention_module
from flexlamps.kernels import attention as da
from flexlamps.models.blocks.attention import BF16_TOLERANCE, attention

from tests.kernel_variants import levels, variant_kernel

LAYER_KERNEL = attention_module.native_attention_kernel()  # what the layers run in this process


@pytest.fixture(params=levels(da.KERNEL))
def kernel(request) -> da.NativeAttention:
    return variant_kernel(da.KERNEL, request.param)


def _case(n, heads, kv, span, d, dtype, seed=0, capacity=None, t=1):
    """q, and keys / values as views of a larger cache (strided rows); a decode mask per row
    (t = 1), or a causal chunk of t queries ending at the row's last key."""
    g = torch.Generator().manual_seed(seed)
    capacity = capacity or span + 7
    q = torch.randn(n, heads, t, d, generator=g).to(dtype)
    cache = (torch.randn(2, n, kv, capacity, d, generator=g) * 2).to(dtype)
    last = torch.randint(t - 1, span, (n,), generator=g)
    last[0] = span - 1
    positions = last[:, None] - torch.arange(t - 1, -1, -1)[None, :]  # (n, t)
    mask = torch.arange(span)[None, None, :] <= positions[:, :, None]
    return q, cache[0, :, :, :span], cache[1, :, :, :span], mask


def _max_error(got, want, values):
    return ((got.float() - want.float()).abs().max() / values.float().abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, kv, d", [(9, 3, 64), (4, 4, 64), (8, 2, 128), (16, 1, 32), (6, 3, 80), (12, 4, 96)])
@pytest.mark.parametrize("span, t", [(1, 1), (15, 1), (16, 1), (17, 1), (160, 1), (1000, 1), (17, 17), (200, 37)])
def test_the_kernel_is_its_arithmetic_and_within_the_bound_of_float32(kernel, dtype, heads, kv, d, span, t):
    q, keys, values, mask = _case(3, heads, kv, span, d, dtype, seed=span + d, t=t)
    got = kernel(q, keys, values, mask)
    assert got.shape == (3, heads, t, d) and got.dtype == dtype
    # the same arithmetic in torch: equal but for the order of fp32 sums (and a probability on a
    # rounding boundary moving one step)
    assert _max_error(got, da.reference(q, keys, values, mask), values) <= 2 ** -9
    exact = da.reference(q.float(), keys.float(), values.float(), mask)
    assert _max_error(got, exact, values) <= BF16_TOLERANCE


def test_a_row_does_not_depend_on_the_rows_beside_it_the_padding_or_the_threads(kernel):
    q, keys, values, mask = _case(8, 9, 3, 200, 64, torch.bfloat16, seed=3)
    full = kernel(q, keys, values, mask)
    for r in range(8):
        alone = kernel(q[r:r + 1], keys[r:r + 1], values[r:r + 1], mask[r:r + 1])
        assert torch.equal(alone, full[r:r + 1])
        own = int(mask[r, 0].sum())  # its keys only: no masked tail
        assert torch.equal(kernel(q[r:r + 1], keys[r:r + 1, :, :own], values[r:r + 1, :, :own], mask[r:r + 1, :, :own]),
                           full[r:r + 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(kernel(q, keys, values, mask), full)
    finally:
        torch.set_num_threads(threads)
    # contiguous copies, an int mask: the same bits
    assert torch.equal(kernel(q.contiguous(), keys.contiguous(), values.contiguous(), mask.to(torch.uint8)), full)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_query_in_a_chunk_equals_itself_alone(kernel, dtype):
    """Every query of a chunk (its keys converted once for a block of 16 queries, two blocks here)
    equals the query alone (a decode: its keys converted as read)."""
    q, keys, values, mask = _case(2, 8, 2, 90, 128, dtype, seed=5, t=24)
    chunk = kernel(q, keys, values, mask)
    for r in range(2):
        for i in range(24):
            alone = kernel(q[r:r + 1, :, i:i + 1], keys[r:r + 1], values[r:r + 1], mask[r:r + 1, i:i + 1])
            assert torch.equal(alone, chunk[r:r + 1, :, i:i + 1])
    # one mask row for every query of a row is broadcast, as torch's attention does
    shared = mask[:, -1:]
    assert torch.equal(kernel(q, keys, values, shared), kernel(q, keys, values, shared.expand(2, 24, 90).contiguous()))


@pytest.mark.skipif(LAYER_KERNEL is None, reason="the layers run torch's attention here")
def test_attention_runs_it_for_bf16_and_fp16_on_the_cpu():
    q, keys, values, mask = _case(4, 9, 3, 50, 64, torch.bfloat16)
    assert torch.equal(attention(q, keys, values, mask), LAYER_KERNEL(q, keys, values, mask))
    # fp32 keys of a bf16 step (a cache held in another dtype) are rounded to bf16 first
    assert torch.equal(attention(q, keys.float(), values.float(), mask), LAYER_KERNEL(q, keys, values, mask))
    q, keys, values, mask = _case(2, 9, 3, 50, 64, torch.float16, t=9)  # a prompt chunk
    assert torch.equal(attention(q, keys, values, mask), LAYER_KERNEL(q, keys, values, mask))
    assert not LAYER_KERNEL.takes(q.float(), keys.float())  # fp32 keeps the exact per-query path
    assert not LAYER_KERNEL.takes(torch.randn(1, 9, 1, 72).bfloat16(), torch.randn(1, 3, 5, 72).bfloat16())  # d % 16
    assert not LAYER_KERNEL.takes(torch.randn(1, 9, 1, 64).bfloat16(), torch.randn(1, 2, 5, 64).bfloat16())  # 9 % 2
    assert not LAYER_KERNEL.takes(torch.randn(2, 9, 1, 64).bfloat16(), torch.randn(1, 3, 5, 64).bfloat16())  # rows
    assert not LAYER_KERNEL.takes(torch.randn(1, 9, 1, 64).bfloat16(), torch.randn(1, 3, 5, 32).bfloat16())  # head size
    with pytest.raises(ValueError, match="values"):
        LAYER_KERNEL(q, keys, values[:, :, :-1], mask)


def test_a_query_that_sees_no_key_gets_zeros(kernel):
    q, keys, values, mask = _case(2, 9, 3, 20, 64, torch.bfloat16)
    mask = mask.clone()
    mask[1] = False
    got = kernel(q, keys, values, mask)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    assert torch.equal(got[:1], kernel(q[:1], keys[:1], values[:1], mask[:1]))


@pytest.mark.parametrize("t", [1, 20])
def test_keys_of_probability_zero_add_nothing_whatever_their_values(kernel, t):
    """Keys masked between visible ones (every query's probability exactly 0) and keys whose weight
    underflows to 0 for one query of a group but not for the others (a query of large scores):
    skipped, so NaN values there leave the result of the visible keys' values, in a decode and a
    causal chunk (keys converted once for a block)."""
    q, keys, values, mask = _case(2, 9, 3, 40, 64, torch.bfloat16, seed=7, t=t)
    keys, values, mask, q = keys.clone(), values.clone(), mask.clone(), q.clone()
    mask[:, :, 5:12] = False
    q[:, 0] *= 60  # head 0's scores span hundreds: most of its weights underflow, its group's do not
    finite = values.clone()
    finite[:, :, 5:12] = 0
    keys[:, :, 5:12] = values[:, :, 5:12] = float("nan")
    got = kernel(q, keys, values, mask)
    assert not got.isnan().any()
    want = da.reference(q, keys.nan_to_num(), finite, mask)
    assert torch.equal(got, kernel(q, keys.nan_to_num(), finite, mask))
    assert _max_error(got, want, finite) <= 2 ** -9


def test_an_empty_batch_gives_an_empty_output(kernel):
    q, keys, values, mask = _case(1, 9, 3, 10, 64, torch.bfloat16)
    assert kernel(q[:0], keys[:0], values[:0], mask[:0]).shape == (0, 9, 1, 64)


def test_the_source_ships_with_the_package():
    assert da.SOURCE.is_file() and os.path.basename(da.SOURCE) == "attention.c"
