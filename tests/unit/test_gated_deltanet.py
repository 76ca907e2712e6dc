"""The gated delta rule and its causal conv: against its exact (float64) definition and transformers'
torch reference, its chunked and recurrent forms against each other, padding that leaves a row's
state untouched, and the rule on chunks at absolute positions (what the engine runs) giving the
same bits however a sequence is split."""

import pytest
import torch

from flexlamps.models.blocks.aligned_delta_rule import OpenChunk, aligned_gated_delta_rule
from flexlamps.models.blocks.gated_deltanet import (CHUNK, causal_conv, chunk_gated_delta_rule,
                                                    recurrent_gated_delta_rule)


def _inputs(n=2, t=100, key_heads=2, value_heads=4, dk=8, dv=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, t, key_heads, dk, generator=g), torch.randn(n, t, key_heads, dk, generator=g)
    v = torch.randn(n, t, value_heads, dv, generator=g)
    decay = -torch.rand(n, t, value_heads, generator=g) * 2
    beta = torch.rand(n, t, value_heads, generator=g)
    return q, k, v, decay, beta


def _exact_rule(q, k, v, g, beta, state):
    """The rule's definition token by token in float64: what both float32 forms approximate."""
    group = v.shape[2] // k.shape[2]
    q, k = (x.double().repeat_interleave(group, dim=2) for x in (q, k))
    q, k = (x / (x * x).sum(-1, keepdim=True).add(1e-6).sqrt() for x in (q, k))
    q = q / q.shape[-1] ** 0.5
    s, outs = state.double(), []
    for i in range(q.shape[1]):
        s = s * g[:, i].double().exp()[..., None, None]
        delta = (v[:, i].double() - (s * k[:, i, :, :, None]).sum(-2)) * beta[:, i].double()[..., None]
        s = s + k[:, i, :, :, None] * delta[:, :, None]
        outs.append((s * q[:, i, :, :, None]).sum(-2))
    return torch.stack(outs, 1), s


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("decay", [2.0, 20.0, 55.0])
def test_chunked_form_is_exact_to_float32_where_transformers_loses_digits(seed, decay):
    """g drawn in (-decay, 0] (tiny random checkpoints reach -55 a token). transformers' chunked
    form takes the in-chunk cumulative decay sums in fp32 and loses digits to their size (measured
    1.2e-6 / 3.7e-6 / 1.1e-5 from the exact rule at decay 2 / 20 / 55); ours (fp64 sums,
    gated_deltanet._chunk_decays) stays at fp32 rounding (<= 1.5e-7) and within transformers' own
    error of its result. The recurrent form is transformers' bit for bit."""
    from transformers.models.qwen3_next import modeling_qwen3_next as ref

    q, k, v, _, beta = _inputs(t=150, seed=seed)
    g = -torch.rand(beta.shape, generator=torch.Generator().manual_seed(seed + 9)) * decay
    state = torch.randn(2, 4, 8, 12, generator=torch.Generator().manual_seed(seed + 5))
    exact_out, exact_final = _exact_rule(q, k, v, g, beta, state)
    out, final = chunk_gated_delta_rule(q, k, v, g, beta, state)
    ref_out, _ = ref.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    ours_error = max((out - exact_out).abs().max().item(), (final - exact_final).abs().max().item())
    ref_error = (ref_out - exact_out).abs().max().item()
    assert ours_error <= 5e-7, ours_error
    assert (out - ref_out).abs().max().item() <= ref_error + ours_error
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


def _split_run(q, k, v, g, beta, sizes, lengths=None):
    """The aligned rule over `sizes`-token steps from an empty state: (outputs, state, open chunk)."""
    n, hk, dk = q.shape[0], q.shape[2], q.shape[3]
    hv, dv = v.shape[2], v.shape[3]
    state = torch.zeros(n, hv, dk, dv)
    open_chunk = OpenChunk(torch.zeros(n, CHUNK - 1, hk * dk + hv * dv + hv), torch.zeros(n, CHUNK - 1, hv),
                           torch.zeros(n, dtype=torch.long))
    outs, at = [], 0
    for i, size in enumerate(sizes):
        part = (x[:, at:at + size] for x in (q, k, v, g, beta))
        real = None if lengths is None or i < len(sizes) - 1 else lengths
        out, state, open_chunk = aligned_gated_delta_rule(*part, state, open_chunk, real)
        outs.append(out)
        at += size
    return torch.cat(outs, dim=1), state, open_chunk


@pytest.mark.parametrize("sizes", [[64, 76], [30, 30, 80], [7] * 20, [1] * 70 + [70], [63, 1, 64, 12], [100, 1, 1, 38]])
def test_the_aligned_rule_gives_the_same_bits_however_a_sequence_is_split(sizes):
    """Chunks at absolute positions with the open chunk carried: a prompt in steps of any size, or
    decoded a token at a time, gives one whole prefill's outputs, boundary state and open chunk."""
    q, k, v, g, beta = _inputs(t=140)
    whole = chunk_gated_delta_rule(q, k, v, g, beta, None)[0]
    out, state, open_chunk = _split_run(q, k, v, g, beta, sizes)
    one_step, one_state, one_open = _split_run(q, k, v, g, beta, [140])
    assert torch.equal(one_step, whole) and torch.equal(out, whole)
    assert torch.equal(state, one_state) and torch.equal(open_chunk.kvb, one_open.kvb)
    assert open_chunk.length.tolist() == [140 % CHUNK] * 2
    _, boundary = chunk_gated_delta_rule(*(x[:, :128] for x in (q, k, v, g, beta)), None)
    assert torch.equal(state, boundary)  # the state at the last boundary (128), 12 tokens open


def test_the_aligned_rule_ignores_padding_after_a_rows_real_tokens():
    q, k, v, g, beta = _inputs(t=90)
    out, state, open_chunk = _split_run(q, k, v, g, beta, [20, 70], torch.tensor([70, 51]))
    alone, alone_state, alone_open = _split_run(*(x[1:, :71] for x in (q, k, v, g, beta)), [20, 51])
    assert torch.equal(out[1:, :71], alone) and torch.equal(state[1:], alone_state)
    assert torch.equal(open_chunk.kvb[1:], alone_open.kvb) and open_chunk.length.tolist() == [90 % CHUNK, 71 % CHUNK]
