"""Multi-head latent attention (DeepSeek-V2/V3) and DeepSeek-V3.2's lightning-indexer selection.

The math a latent cache runs once it holds the entries; the cache decides where entries live
and which it gathers. Attention always runs in the absorbed form: the query is multiplied into
latent space by the key half of `kv_b_proj` (W_UK) once, scores are taken against the cached
latents directly, and the weighted sum of latents is expanded by the value half (W_UV) after.
So a decode step reads `kv_lora_rank + qk_rope_head_dim` values per selected entry and never
expands the cache into per-head keys and values.

Selection (V3.2): every query scores every cached indexer key,
  score[t, s] = sum_h w[t, h] * relu(scale * q[t, h] . k[s]),
and attends to the `index_topk` best visible entries. Ties are broken toward the earlier
position (a stable sort), so every cache layout that holds the same entries picks the same
ones; the chosen entries are then taken in position order, so the reductions over them run
in the same order everywhere and results agree bit for bit.

Batch invariance (`weight_kind`'s rule): a row's bits depend on the row and its phase, never
on the rows beside it. The per-head products with W_UK and W_UV run with the heads as the batch
and every row of the step as a row of one GEMM per head (`head_products`), at least
`row_products.min_rows` rows (MKL runs a few rows on another kernel); the attention over the
entries is `attention.attention`'s exact path (MQA: one key head, the latent and its rotary key
side by side as the key, the latent as the value), whose shape rules make a query's result
independent of the step's other rows, its padded span and its chunk; the indexer's head-weighted
sum runs at min_rows rows too, and its products over at least MIN_SPAN keys. tests/unit/test_mla_exact.py checks each product.

Attention may also run in parts (`partial_attention`: the entries already on the compute
device while the others are still being copied in) and the parts be merged by their
log-sum-exp (`merge_partials`): the same result up to fp32 rounding, not bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flexlamps.models.blocks.attention import MIN_SPAN, AttnOptions, attention
from flexlamps.models.blocks.row_products import rows_product


@dataclass
class MLAStep:
    """What one layer hands its latent cache for one step of n rows of T tokens."""

    q_latent: torch.Tensor  # (n, H, T, R) the no-rope query times W_UK: in latent space
    q_rope: torch.Tensor  # (n, H, T, r) rotated query
    latent: torch.Tensor  # (n, T, R) the new tokens' normalized latents (what is cached)
    k_rope: torch.Tensor  # (n, T, r) the new tokens' rotated shared keys (cached beside them)
    softmax_scale: float
    index_q: torch.Tensor | None = None  # (n, T, Hi, Di) indexer queries, rotated
    index_w: torch.Tensor | None = None  # (n, T, Hi) fp32 per-head weights, scaled by Hi ** -0.5
    index_k: torch.Tensor | None = None  # (n, T, Di) the new tokens' indexer keys (cached)
    index_topk: int = 0  # 0: no selection, attend to every visible entry

    @property
    def is_sparse(self) -> bool:
        return self.index_topk > 0


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope (n, T, H, nope) times each head's W_UK (H, nope, R) -> q_latent (n, H, T, R)."""
    n, t, heads, nope = q_nope.shape
    rows = q_nope.permute(2, 0, 1, 3).reshape(heads, n * t, nope)  # (H, n*T, nope)
    return rows_product(rows, w_uk).view(heads, n, t, -1).transpose(0, 1)


def expand_values(attended: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """attended latents (n, H, T, R) times each head's W_UV (H, v, R) -> values (n, T, H * v)."""
    n, heads, t, rank = attended.shape
    rows = attended.transpose(0, 1).reshape(heads, n * t, rank)  # (H, n*T, R)
    out = rows_product(rows, w_uv.transpose(1, 2))  # (H, n*T, v)
    return out.view(heads, n, t, -1).permute(1, 2, 0, 3).reshape(n, t, -1)


def index_scores(step: MLAStep, keys: torch.Tensor) -> torch.Tensor:
    """(n, T, S) fp32 indexer scores of the step's queries against `keys` (n, S, Di)."""
    q = step.index_q.float()  # (n, T, Hi, Di)
    head_dim, span = q.shape[-1], keys.shape[1]
    if span < MIN_SPAN:  # zero keys: MKL runs a product of fewer than 12 columns on another kernel
        keys = F.pad(keys, (0, 0, 0, MIN_SPAN - span))
    scores = rows_product(q, keys.float().transpose(-1, -2).unsqueeze(1)) * head_dim ** -0.5  # (n, T, Hi, S')
    scores = F.relu(scores)
    return rows_product(step.index_w.unsqueeze(-2), scores).squeeze(-2)[..., :span]  # (n, T, S)


def visible_mask(positions: torch.Tensor, span: int) -> torch.Tensor:
    """(n, T, span) bool: the query at position p sees cache entries 0..p of its own row."""
    return torch.arange(span, device=positions.device)[None, None, :] <= positions[:, :, None]


def select_topk(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `topk` best visible entries of each query, in position order.

    Args:
        scores: (n, T, S) indexer scores.
        visible: (n, T, S) which entries each query may see.
        topk: entries to keep (fewer when S is smaller).
    Returns:
        indices (n, T, k) int64 ascending, and valid (n, T, k) bool: False where a query sees
        fewer than k entries and the slot holds an invisible one.
    """
    k = min(topk, scores.shape[-1])
    masked = scores.masked_fill(~visible, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :k]
    indices = order.sort(dim=-1).values
    return indices, visible.gather(-1, indices)


def topk_mask(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """(n, T, S) bool: visible entries among each query's top-k (the dense form of select_topk)."""
    indices, valid = select_topk(scores, visible, topk)
    keep = torch.zeros_like(visible)
    return keep.scatter_(-1, indices, valid)


def latent_attention(step: MLAStep, entries: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Attention over cached entries, in latent space.

    Args:
        entries: (n, S, R + r) cached latents with their rotated keys after them (a latent
            cache's records in the compute dtype).
        keep: (n, T, S) bool, which entries each query attends to.
    Returns:
        (n, H, T, R): the attention-weighted sum of latents per head (times W_UV gives values).
    """
    rank = step.q_latent.shape[-1]
    q = torch.cat([step.q_latent, step.q_rope], dim=-1)  # (n, H, T, R + r)
    keys = entries.unsqueeze(1)  # (n, 1, S, R + r): one key head shared by all heads
    return attention(q, keys, keys[..., :rank], keep, AttnOptions(scale=step.softmax_scale))


def _scores(step: MLAStep, latent: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
    """(n, H, T, S) scaled scores of every head's queries against the entries. The heads are
    folded into the rows of one GEMM per sequence: broadcasting the shared entries over the
    heads instead makes matmul copy them once per head (docs/performance.md, "The model blocks'
    choices")."""
    n, heads, t, _ = step.q_latent.shape
    scores = torch.bmm(step.q_latent.reshape(n, heads * t, -1), latent.transpose(1, 2))  # (n, H*T, S)
    scores = scores + torch.bmm(step.q_rope.reshape(n, heads * t, -1), k_rope.transpose(1, 2))
    return (scores * step.softmax_scale).view(n, heads, t, -1)


def _weighted_latents(probs: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
    """probs (n, H, T, S) times latent (n, S, R) -> (n, H, T, R), heads folded into rows."""
    n, heads, t, span = probs.shape
    return torch.bmm(probs.reshape(n, heads * t, span), latent).view(n, heads, t, -1)


def gather_entries(table: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows of table (n, S, d) at indices (n, k) -> (n, k, d)."""
    return table.gather(1, indices.unsqueeze(-1).expand(-1, -1, table.shape[-1]))


def partial_attention(step: MLAStep, latent: torch.Tensor, k_rope: torch.Tensor,
                      keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`latent_attention` over a part of the entries, normalized within the part, with the
    part's log-sum-exp of scores, for `merge_partials`.

    Returns:
        out (n, H, T, R) fp32 (zeros where a query keeps nothing of this part) and lse (n, H, T)
        fp32 (-inf there).
    """
    scores = _scores(step, latent, k_rope).float().masked_fill(~keep.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (n, H, T)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num_(0.0)  # a query keeping nothing: all 0
    return _weighted_latents(probs.to(latent.dtype), latent).float(), lse


def merge_partials(parts: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype) -> torch.Tensor:
    """Attention over the union of disjoint parts from each part's (out, lse): each part's
    output weighted by its share of the total exp-sum; (n, H, T, R) in `dtype`."""
    lses = torch.stack([lse for _, lse in parts])  # (P, n, H, T)
    shares = torch.exp(lses - torch.logsumexp(lses, dim=0)).nan_to_num_(0.0)
    merged = sum(share.unsqueeze(-1) * out for share, (out, _) in zip(shares, parts))
    return merged.to(dtype)
