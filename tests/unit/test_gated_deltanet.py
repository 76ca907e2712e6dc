"""The gated delta rule and its causal conv: transformers' torch reference, its chunked and
recurrent forms against each other, and padding that leaves a row's state untouched."""

import pytest
import torch

from flexlamps.models.blocks.gated_deltanet import (causal_conv, chunk_gated_delta_rule,
                                                    recurrent_gated_delta_rule)


def _inputs(n=2, t=100, key_heads=2, value_heads=4, dk=8, dv=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, t, key_heads, dk, generator=g), torch.randn(n, t, key_heads, dk, generator=g)
    v = torch.randn(n, t, value_heads, dv, generator=g)
    decay = -torch.rand(n, t, value_heads, generator=g) * 2
    beta = torch.rand(n, t, value_heads, generator=g)
    return q, k, v, decay, beta


@pytest.mark.parametrize("seed", [0, 1])
def test_both_forms_equal_transformers_reference(seed):
    from transformers.models.qwen3_next import modeling_qwen3_next as ref

    q, k, v, g, beta = _inputs(seed=seed)
    state = torch.randn(2, 4, 8, 12, generator=torch.Generator().manual_seed(seed + 5))
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, state)
    ref_out, ref_final = ref.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                          output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert torch.equal(out, ref_out) and torch.equal(final, ref_final)
    one = tuple(x[:, :1] for x in (q, k, v, g, beta))
    out, final = recurrent_gated_delta_rule(*one, state)
    ref_out, ref_final = ref.torch_recurrent_gated_delta_rule(*one[:3], g=one[3], beta=one[4], initial_state=state,
                                                              output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert torch.equal(out, ref_out) and torch.equal(final, ref_final)


def test_chunked_and_recurrent_forms_agree_and_chunks_can_be_cut_anywhere():
    q, k, v, g, beta = _inputs()
    whole, final = chunk_gated_delta_rule(q, k, v, g, beta, None)
    token_by_token, rec_final = recurrent_gated_delta_rule(q, k, v, g, beta, None)
    assert (whole - token_by_token).abs().max() <= 2e-6 and (final - rec_final).abs().max() <= 2e-6
    first, mid = chunk_gated_delta_rule(*(x[:, :37] for x in (q, k, v, g, beta)), None)
    rest, end = chunk_gated_delta_rule(*(x[:, 37:] for x in (q, k, v, g, beta)), mid)
    assert (torch.cat([first, rest], 1) - whole).abs().max() <= 2e-6 and (end - final).abs().max() <= 2e-6


def test_padding_after_a_rows_tokens_leaves_its_state_exactly():
    """beta = g = 0 on padded tokens: the final state is the row's state after its last real token, bit
    for bit (what a padded prefill group relies on)."""
    q, k, v, g, beta = _inputs(t=90)
    real = 41
    _, alone = chunk_gated_delta_rule(*(x[:, :real] for x in (q, k, v, g, beta)), None)
    g, beta = g.clone(), beta.clone()
    g[:, real:], beta[:, real:] = 0, 0
    _, padded = chunk_gated_delta_rule(q, k, v, g, beta, None)
    assert torch.equal(padded, alone)


def test_causal_conv_state_is_the_window_before_each_rows_next_token():
    g = torch.Generator().manual_seed(3)
    x, weight = torch.randn(2, 9, 5, generator=g), torch.randn(5, 1, 4, generator=g)
    zeros = torch.zeros(2, 5, 3)
    whole, _ = causal_conv(x, zeros, weight, None)
    head, state = causal_conv(x[:, :6], zeros, weight, None)
    tail, _ = causal_conv(x[:, 6:], state, weight, None)
    assert torch.equal(torch.cat([head, tail], 1), whole)
    _, padded_state = causal_conv(x, zeros, weight, torch.tensor([6, 9]))  # row 0 padded after 6 tokens
    assert torch.equal(padded_state[0], state[0]) and torch.equal(padded_state[1], x[1, 6:].T)
    expected = torch.nn.functional.silu(torch.nn.functional.conv1d(
        x.transpose(1, 2), weight, padding=3, groups=5)[..., :9]).transpose(1, 2)
    assert (whole - expected).abs().max() <= 1e-6
