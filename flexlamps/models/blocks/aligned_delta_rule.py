"""The gated delta rule on chunks at absolute positions: every token's output and every state the
same bits however a sequence is split into steps (a prompt in chunks of any size, decodes one token
at a time, a prefix reused, a discarded context recomputed).

The chunked form (models.blocks.gated_deltanet) computes a token from the state at its chunk's
start and the tokens of its chunk before it; a state taken in the middle of a chunk gives the same
values only to float32 rounding. So a row's state here is the state at its last chunk boundary
(a multiple of CHUNK tokens) plus the tokens since then, the open chunk (at most CHUNK - 1 of them:
their k, v and beta as the rule reads them, in the compute dtype, and their g in float32). A step
runs the chunked form over the open chunk followed by its new tokens, from the boundary state, so
each chunk holds the same tokens at the same places as in one whole prefill; it keeps the outputs
of the new tokens, the state at the new last boundary and the tokens after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flexlamps.models.blocks.gated_deltanet import CHUNK, chunk_rule_with_boundaries


@dataclass(frozen=True)
class OpenChunk:
    """The tokens of each row since its last chunk boundary, as the rule reads them."""
    kvb: torch.Tensor  # (n, CHUNK - 1, key_dim + value_dim + Hv) compute dtype: k | v | beta per token
    g: torch.Tensor  # (n, CHUNK - 1, Hv) float32
    length: torch.Tensor  # (n,) tokens held (0 .. CHUNK - 1), the last `length` entries (zeros before)


def _aligned(tail: torch.Tensor, new: torch.Tensor, start: torch.Tensor, width: int) -> torch.Tensor:
    """Per row, `width` entries of cat(tail, new) from `start[row]`; entries out of range repeat
    the first or the last one (callers mask them)."""
    both = torch.cat([tail.to(new.dtype), new], dim=1)
    index = (start[:, None] + torch.arange(width, device=new.device)[None]).clamp(0, both.shape[1] - 1)
    index = index.view(*index.shape, *([1] * (both.dim() - 2))).expand(-1, -1, *both.shape[2:])
    return both.gather(1, index)


def aligned_gated_delta_rule(q, k, v, g, beta, state: torch.Tensor, open_chunk: OpenChunk,
                             lengths: torch.Tensor | None):
    """q, k (n, T, Hk, dk), v (n, T, Hv, dv), beta (n, T, Hv) compute dtype, g (n, T, Hv) fp32, the
    rows' boundary states (n, Hv, dk, dv) fp32 and open chunks; `lengths`: real tokens per row
    (None: all T; padding after them is ignored). Returns (out (n, T, Hv, dv) fp32, boundary states,
    open chunks) after each row's last real token."""
    n, t, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    held = open_chunk.length.to(q.device)
    fed = torch.full_like(held, t) if lengths is None else lengths.to(q.device, torch.long)
    total = held + fed  # tokens since the boundary, after the step
    width = int(held.max()) + t
    start = CHUNK - 1 - held  # where each row's open chunk begins in cat(tail, new)
    kvb = torch.cat([k.reshape(n, t, -1), v.reshape(n, t, -1), beta], dim=-1)
    kvb = _aligned(open_chunk.kvb, kvb, start, width)
    ga = _aligned(open_chunk.g, g, start, width)
    qa = _aligned(q.new_zeros(n, CHUNK - 1, hk, dk), q, start, width)
    real = (torch.arange(width, device=q.device)[None] < total[:, None])[..., None]
    kvb, ga = kvb * real, ga * real  # padding leaves the state as the last real token left it
    ka, va, ba = kvb.split([hk * dk, hv * dv, hv], dim=-1)
    out, _, boundary = chunk_rule_with_boundaries(qa, ka.reshape(n, width, hk, dk), va.reshape(n, width, hv, dv),
                                                  ga, ba, state, total // CHUNK)
    rows = (held[:, None] + torch.arange(t, device=q.device)[None])[..., None, None].expand(-1, -1, hv, dv)
    done = total // CHUNK * CHUNK  # each row's new last boundary
    left = total - done  # tokens past it, kept as the last `left` entries of the open chunk
    first = done + left - (CHUNK - 1)
    kept = (torch.arange(CHUNK - 1, device=q.device)[None] >= (CHUNK - 1 - left)[:, None])[..., None]
    tail_kvb = _aligned(kvb[:, :0], kvb, first, CHUNK - 1) * kept
    tail_g = _aligned(ga[:, :0], ga, first, CHUNK - 1) * kept
    return out.gather(1, rows), boundary, OpenChunk(tail_kvb, tail_g, left)
