"""The gated delta rule (Gated DeltaNet's linear attention) as transformers' torch reference
computes it (`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`, the causal conv1d):
float32 throughout, whatever the compute dtype.

Per value head the state S (key_head_dim x value_head_dim) evolves token by token as
    S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  out = S^T q / sqrt(d)
with q, k L2-normalized. The chunked form (chunks of `CHUNK` tokens: a triangular solve inside each
chunk, one state update per chunk) is what the engine runs for prompts and decodes alike, on chunks
at absolute positions (models.blocks.aligned_delta_rule); the recurrent form is transformers' decode,
kept as the reference both are checked against (the same values to float32 rounding,
tests/unit/test_gated_deltanet.py).

Rows of a step may be padded after their real tokens (`valid`): a padded token gets beta = 0 and
g = 0, so it leaves the state exactly as the row's last real token left it (its k_beta and v_beta
are zero, so every term it adds is an exact zero), and the state at the end of the step is each
row's state after its own last token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.activation import silu

from flexlamps.models.hybrid_config import DELTA_RULE_CHUNK as CHUNK  # ours (transformers' is 64: hybrid_config)
L2_EPS = 1e-6  # transformers' l2norm of the DeltaNet's queries and keys uses this eps


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def causal_conv(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution + SiLU of x (n, T, C) after `conv_state` (n, C, K-1), the row's
    previous K-1 inputs (zeros for a new sequence). Returns the output (n, T, C) and the new conv
    state: the K-1 inputs ending at each row's last real token (`lengths`; None: all T).
    Written as K shifted products added in tap order, so a token's result depends on nothing but
    its own window (not on T or the batch), whatever the step's shape."""
    n, t, c = x.shape
    k = weight.shape[-1]
    window = torch.cat([conv_state.transpose(1, 2).to(x.dtype), x], dim=1)  # (n, K-1+T, C)
    taps = weight.reshape(c, k).to(x.dtype)
    out = window[:, 0:t] * taps[:, 0]
    for j in range(1, k):
        out = out + window[:, j:j + t] * taps[:, j]
    if lengths is None:
        new_state = window[:, t:]
    else:
        index = lengths.to(x.device)[:, None] + torch.arange(k - 1, device=x.device)[None]  # (n, K-1)
        new_state = window.gather(1, index[:, :, None].expand(n, k - 1, c))
    return silu(out), new_state.transpose(1, 2)


def _heads_first(q, k, v, g, beta, value_heads: int):
    """fp32 (n, H, T, ...) tensors; q and k repeated so each serves its group of value heads and
    L2-normalized (each form then scales q by 1/sqrt(d) as transformers' does: times d ** -0.5 in
    the chunked form, divided by sqrt(d) in the recurrent one)."""
    group = value_heads // k.shape[2]
    if group > 1:
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    q, k, v, g, beta = (t.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for t in (q, k, v, g, beta))
    return l2norm(q), l2norm(k), v, g, beta


def _chunk_decays(g: torch.Tensor):
    """g (n, H, chunks, C) fp32 -> the decays within each chunk, fp32: exp(cum_i) from the chunk's
    start to token i, exp(cum_last - cum_i) from token i to its end, exp(cum_i - cum_j) from j to
    i (0 for j > i), with cum the running sum of g over the chunk.
    transformers takes the cumulative sums in fp32: a chunk's sum reaches hundreds (g down to -55 a
    token on a tiny random checkpoint), so a difference of two near the diagonal, of order one,
    loses digits to its operands' rounding (ulp(640) = 6e-5, exp's relative error). In fp64 each
    decay is exact to fp32 rounding: 5-15x closer than transformers' whole forward to the same
    forward in fp64 (docs/models.md); the sums stay per chunk at absolute positions, so every
    split of a sequence still gives the same bits."""
    cum = g.to(torch.float64).cumsum(dim=3)
    chunk = g.shape[-1]
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=g.device).triu(1)
    pair = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf"))
    return (x.exp().to(torch.float32) for x in (cum, cum[..., -1:] - cum, pair))


def chunk_gated_delta_rule(q, k, v, g, beta, state: torch.Tensor | None, chunk: int = CHUNK):
    """q, k (n, T, Hk, dk), v (n, T, Hv, dv), g and beta (n, T, Hv), state (n, Hv, dk, dv) fp32 or
    None (zeros) -> (out (n, T, Hv, dv) fp32, final state)."""
    t = q.shape[1]
    out, final, _ = chunk_rule_with_boundaries(q, k, v, g, beta, state, None, chunk)
    return out[:, :t], final


def chunk_rule_with_boundaries(q, k, v, g, beta, state: torch.Tensor | None, keep_after: torch.Tensor | None,
                               chunk: int = CHUNK):
    """The chunked form (arguments as `chunk_gated_delta_rule`), returning (out (n, T padded to
    chunks, Hv, dv) fp32, the state after the last chunk (with `keep_after`: only if some row
    keeps it, else the one before), per row the state after its first `keep_after[row]` chunks
    (None when `keep_after` is None))."""
    n, t = q.shape[:2]
    q, k, v, g, beta = _heads_first(q, k, v, g, beta, v.shape[2])
    q = q * q.shape[-1] ** -0.5
    pad = (chunk - t % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    heads, dk, dv = v.shape[1], k.shape[-1], v.shape[-1]
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(n, heads, -1, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    from_start, to_end, pair_decay = _chunk_decays(g.reshape(n, heads, -1, chunk))
    ut_system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    intra = (q @ k.transpose(-1, -2)) * pair_decay
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_beta * from_start[..., None], upper=False,
                                               unitriangular=True)
    s = q.new_zeros(n, heads, dk, dv) if state is None else state.to(torch.float32)
    if keep_after is None:
        kept = None
    elif not bool(keep_after.any()):
        kept = s  # no row completes a chunk (a decode, mostly): the state it came with, not a copy
    else:
        kept = torch.where((keep_after == 0)[:, None, None, None], s, 0)
    out = torch.zeros_like(new_values)
    q = q * from_start[..., None]
    k = k * to_end[..., None]
    chunk_decay = from_start[..., -1, None, None]
    chunks = q.shape[2]
    # with `keep_after`, the state after the last chunk only matters where a row keeps it (a
    # decode's open chunk rarely completes): its update, a third of the loop's work, is skipped
    last_needed = keep_after is None or bool((keep_after == chunks).any())
    for i in range(chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ s
        out[:, :, i] = q[:, :, i] @ s + intra[:, :, i] @ v_new
        if i + 1 == chunks and not last_needed:
            break
        s = s * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
        if kept is not None:
            kept = torch.where((keep_after == i + 1)[:, None, None, None], s, kept)
    out = out.reshape(n, heads, -1, dv)
    return out.transpose(1, 2), s, kept


def recurrent_gated_delta_rule(q, k, v, g, beta, state: torch.Tensor | None):
    """The token-by-token form (transformers' decode steps); arguments and results as
    `chunk_gated_delta_rule`."""
    n, t = q.shape[:2]
    q, k, v, g, beta = _heads_first(q, k, v, g, beta, v.shape[2])
    q = q / q.shape[-1] ** 0.5
    heads, dk, dv = v.shape[1], k.shape[-1], v.shape[-1]
    s = q.new_zeros(n, heads, dk, dv) if state is None else state.to(torch.float32)
    out = torch.zeros_like(v)
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        k_i = k[:, :, i].unsqueeze(-1)
        delta = (v[:, :, i] - (s * k_i).sum(dim=-2)) * beta[:, :, i].unsqueeze(-1)
        s = s + k_i * delta.unsqueeze(-2)
        out[:, :, i] = (s * q[:, :, i].unsqueeze(-1)).sum(dim=-2)
    return out.transpose(1, 2), s


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNormGated: normalize in fp32, round to the input dtype, scale, then times
    silu(gate) in fp32, rounded once."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = weight * h.to(dtype)
    return (h * silu(gate.to(torch.float32))).to(dtype)
