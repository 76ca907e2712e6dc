"""`attention(q, keys, values, mask, opts)`: the attention every KV cache calls once it has its keys.

`AttnOptions` carries what a family changes about it: the softmax scale, tanh soft-capping of the
scores (Gemma-2), a sliding window (the caches fold it into the mask they build from key
positions: `visible_keys`) and attention sinks (gpt-oss: a learned logit per head that joins the
softmax's denominator and attends to nothing). The fused kernels below (the AVX-512 kernel,
torch's flash kernel, SDPA elsewhere) take a scale and any mask; with soft-capping or sinks the
exact fp32 path runs on every device, its shape rules unchanged (the sink is one more column
before the keys, the same for every query of its head).

float32 and float16 on the CPU: a query's result depends only on that query and the keys its mask lets it
see: not on the other rows of the step, on how far the step's keys are padded (the longest row's
span), nor on how many queries share its chunk (a decode, a prompt chunk, a recompute). That is
what lets a scheduled run (any rows sharing a step, any chunking) equal each request generated
alone, bit for bit. torch's `scaled_dot_product_attention` does not keep it (its result moves by
up to ~4e-7 with the padded span or the chunk length), nor does a plain `softmax(q k^T) v`, as
MKL's GEMM picks its kernel and its split of the reduction by shape. So every product here is
given shapes under which MKL's per-element result is fixed, measured on this class of machine
and asserted by tests/unit/test_attention_exact.py:
- at least `min_rows(head size)` query rows per product (fewer rows run another kernel; fewer are
  padded; `row_products`, the rule every row-invariant product outside `linear` keeps);
- keys in blocks of `KEY_BLOCK` for the product with the values (MKL splits a longer reduction
  at points that depend on its length), the blocks' partial results added in key order; a block
  past a query's last key holds probabilities of exactly 0 and adds exactly 0;
- softmax over at least `MIN_SPAN` keys (its vectorized sums add masked zeros lane by lane).
Scores and softmax run in fp32; in fp16 the probabilities are rounded to fp16 before the
product with the values (as torch's flash kernel does), and the result is rounded once at the
end. Long prompt chunks run in blocks of queries (a query's result does not depend on its
block), which bounds the scores' memory.

bfloat16 on the CPU without our kernel runs the same exact path (keys and values upcast, the
probabilities rounded to bf16 before the product with the values, one rounding at the end), so a
query's bits do not depend on its step either (`weight_kind`'s batch invariance). torch's flash
kernel, faster on a prompt, moves a query's result with the step's shapes; it no longer runs.
`BF16_TOLERANCE`: how far a bf16 result may be from float32's, as a fraction of the largest
|value| the query attends over (each rounding of a probability or of the result is within 2^-9
relative; measured at most 0.0032).

bf16 and fp16 on the CPU run `native_attention`'s AVX-512 kernel where it is built, a decode or
a prompt chunk alike: the flash kernel's arithmetic (fp32 scores, exp(score - max) rounded to the
dtype, fp32 sums divided by the weights' sum, one rounding), each kv head's keys read once for its
query heads, no key after a query's last visible one read, and a query's result depending on
nothing but its own query, keys and mask (tests/unit/test_native_attention.py); what it saves
is in docs/performance.md ("The model blocks' choices"). Without it (no AVX-512, no compiler) the
paths below run.

On other devices torch's SDPA runs (no such promise there).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from placement.attention_scratch import KEY_BLOCK, MIN_SPAN, padded_span as padded_keys, query_chunk

from flexlamps.kernels import attention as native_attention, loader
from flexlamps.models.blocks.row_products import min_rows

# NOTE(exact): the three shape rules above (MIN_SPAN, KEY_BLOCK, the query blocks) live with the
# scratch they give, which the layer workspace charges (`placement.attention_scratch`).
# bf16: how far a query's result may be from float32's, or from itself in another step, as a
# fraction of the largest |value| it attends over (see the docstring)
BF16_TOLERANCE = 2.0 ** -7
_LAST_BLOCK = threading.local()  # per thread: the zero-padded last block of values, reused


@dataclass(frozen=True, eq=False)
class AttnOptions:
    """How one layer's attention departs from softmax(q k^T / sqrt(d)) v over its causal keys."""
    scale: float | None = None  # the scores' factor; None: 1 / sqrt(head_dim)
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap), before the mask
    window: int | None = None  # a query at position p sees keys p-window+1..p (applied by the caches)
    sinks: torch.Tensor | None = None  # (heads,) a logit per head in the softmax's denominator

    def __post_init__(self):
        if self.window is not None and self.window < 1:
            raise ValueError(f"AttnOptions: window must be >= 1, got {self.window}")
        if self.softcap is not None and self.softcap <= 0:
            raise ValueError(f"AttnOptions: softcap must be > 0, got {self.softcap}")

    @property
    def fused(self) -> bool:
        """Whether the fused kernels compute it (a scale and a mask): no soft-capping, no sinks."""
        return self.softcap is None and self.sinks is None

    def scale_for(self, head_dim: int) -> float:
        return 1.0 / math.sqrt(head_dim) if self.scale is None else float(self.scale)


PLAIN = AttnOptions()


def visible_keys(span: int, positions: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """The mask (n, T, span) of keys at cache positions 0..span-1 that queries at `positions` (n, T)
    see: 0..p, or with a window p-window+1..p (as transformers masks a sliding window)."""
    keys = torch.arange(span, device=positions.device)[None, None, :]
    mask = keys <= positions[:, :, None]
    if window is not None:
        mask &= keys > positions[:, :, None] - window
    return mask


def windowed(mask: torch.Tensor, window: int | None) -> torch.Tensor:
    """A causal mask (.., T, K) whose queries each see keys 0..j (key index = position, as in a
    packed segment's keys) cut to the last `window` of them."""
    if window is None:
        return mask
    last = mask.sum(-1, keepdim=True)  # keys 0..last-1 seen
    return mask & (torch.arange(mask.shape[-1], device=mask.device) >= last - window)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
              opts: AttnOptions | None = None) -> torch.Tensor:
    """q (n, heads, T, d), keys (n, kv_heads, S, d), values (n, kv_heads, S, dv), mask (n, T, S)
    bool (True: attend; a window already in it) -> (n, heads, T, dv). Values may be the first dv
    columns of the keys (MLA's latents: `mla.latent_attention`)."""
    opts = opts or PLAIN
    heads, kv_heads = q.shape[1], keys.shape[1]
    scale = opts.scale_for(q.shape[-1])
    if not opts.fused:
        return _per_query_attention(q, keys, values, mask, opts)
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=heads != kv_heads,
                                              scale=scale)
    kernel = native_attention_kernel() if q.dtype in native_attention.DTYPES else None
    if kernel is not None and kernel.takes(q, keys) and values.shape[-1] == q.shape[-1]:
        return kernel(q, keys, values, mask, scale)
    return _per_query_attention(q, keys, values, mask, opts)


def native_attention_kernel() -> native_attention.NativeAttention | None:
    """This process's AVX-512 bf16 / fp16 attention, or None (not this CPU, no compiler, or switched
    off by $FLEXLAMPS_NATIVE_KERNELS=0: `flexlamps.kernels.loader`)."""
    return loader.chosen().get("attention")


def _per_query_attention(q, keys, values, mask, opts: AttnOptions) -> torch.Tensor:
    n, heads, t, d = q.shape
    kv_heads, span, value_dim = keys.shape[1], keys.shape[2], values.shape[-1]
    group = heads // kv_heads  # heads h*group..h*group+group-1 read kv head h
    if span < MIN_SPAN:  # zero keys and values, masked out
        grow = MIN_SPAN - span
        keys, values, mask = F.pad(keys, (0, 0, 0, grow)), F.pad(values, (0, 0, 0, grow)), F.pad(mask, (0, grow))
        span = MIN_SPAN
    keys, values = _in_float32(keys, values)
    padded_span = int(padded_keys(span))
    value_blocks = _value_blocks(values, span, padded_span)
    grouped = q.reshape(n, kv_heads, group, t, d)
    chunk = query_chunk(n, heads, padded_span, t)
    outs = []
    for start in range(0, t, chunk):
        end = min(t, start + chunk)
        queries = grouped[:, :, :, start:end].float().reshape(n, kv_heads, group * (end - start), d)
        probs = _probabilities(queries, keys, mask[:, start:end], group, padded_span, opts)
        if q.dtype != torch.float32:
            probs = probs.to(q.dtype).float()
        out = _weighted_values(probs, value_blocks)[:, :, :queries.shape[2]]
        outs.append(out.view(n, kv_heads, group, end - start, value_dim))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
    return out.reshape(n, heads, t, value_dim).to(q.dtype)


def _in_float32(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys and values in fp32; values that are the keys' first columns stay a view of the keys'
    copy (one conversion of MLA's entries, not two)."""
    if (values.data_ptr() == keys.data_ptr() and values.stride() == keys.stride()
            and values.shape[:-1] == keys.shape[:-1]):
        keys = keys.float()
        return keys, keys[..., :values.shape[-1]]
    return keys.float(), values.float()


def _probabilities(queries, keys, mask, group: int, padded_span: int, opts: AttnOptions) -> torch.Tensor:
    """softmax(q k^T * scale), soft-capped, masked keys at probability 0: (n, kv, rows', padded_span),
    where rows' = max(rows, min_rows(d)) (zero queries pad the product; their rows are dropped later).
    Sinks join the softmax as a column before the keys, dropped from what it returns."""
    n, kv_heads, rows, d = queries.shape
    span = keys.shape[2]
    if rows < min_rows(d):
        queries = F.pad(queries, (0, 0, 0, min_rows(d) - rows))
    scores = torch.matmul(queries, keys.transpose(-1, -2)).mul_(opts.scale_for(d))  # (n, kv, rows', S)
    if opts.softcap is not None:
        scores.div_(opts.softcap).tanh_().mul_(opts.softcap)
    real = scores[:, :, :rows].view(n, kv_heads, group, rows // group, span)
    real.masked_fill_(~mask[:, None, None], float("-inf"))
    if padded_span > span:
        scores = F.pad(scores, (0, padded_span - span), value=float("-inf"))
    if opts.sinks is None:
        return torch.softmax(scores, dim=-1)
    column = _sink_column(opts.sinks, scores, group, rows)
    return torch.softmax(torch.cat([column, scores], dim=-1), dim=-1)[..., 1:]


def _sink_column(sinks: torch.Tensor, scores: torch.Tensor, group: int, rows: int) -> torch.Tensor:
    """Each score row's sink logit (n, kv, rows', 1): kv head h's rows are its `group` query heads,
    each over its rows // group queries in order (see `_per_query_attention`); padding rows get 0."""
    n, kv_heads, padded_rows, _ = scores.shape
    per_head = sinks.to(scores.device, torch.float32).view(kv_heads, group, 1)
    column = per_head.expand(kv_heads, group, rows // group).reshape(kv_heads, rows)
    column = F.pad(column, (0, padded_rows - rows))
    return column[None, :, :, None].expand(n, kv_heads, padded_rows, 1)


def _value_blocks(values: torch.Tensor, span: int, padded_span: int) -> list[torch.Tensor]:
    """values (n, kv, S, d) as KEY_BLOCK-long views; the last one zero-padded to full length."""
    blocks = [values[:, :, a:a + KEY_BLOCK] for a in range(0, span - KEY_BLOCK + 1, KEY_BLOCK)]
    if padded_span > span:
        blocks.append(_padded_last_block(values, len(blocks) * KEY_BLOCK))
    return blocks


def _padded_last_block(values: torch.Tensor, start: int) -> torch.Tensor:
    """values[:, :, start:] zero-padded to KEY_BLOCK keys, in a buffer this thread reuses (valid until
    its next call): a decode step's keys grow by one, so only the new rows are written, not a fresh
    zeroed block per layer."""
    n, kv, span, d = values.shape
    real = span - start
    buf, held = getattr(_LAST_BLOCK, "buf", None), getattr(_LAST_BLOCK, "real", 0)
    if (buf is None or buf.shape != (n, kv, KEY_BLOCK, d) or buf.dtype != values.dtype or buf.device != values.device
            or buf.is_inference() != torch.is_inference_mode_enabled()):  # an inference tensor is read-only outside
        buf, held = values.new_zeros(n, kv, KEY_BLOCK, d), 0
    buf[:, :, :real].copy_(values[:, :, start:])
    if held > real:  # rows a longer block left behind
        buf[:, :, real:held].zero_()
    _LAST_BLOCK.buf, _LAST_BLOCK.real = buf, real
    return buf


def _weighted_values(probs: torch.Tensor, value_blocks: list[torch.Tensor]) -> torch.Tensor:
    """probs (n, kv, rows, padded_span) @ values, one key block at a time, added in key order."""
    out = None
    for idx, block in enumerate(value_blocks):
        part = torch.matmul(probs[..., idx * KEY_BLOCK:(idx + 1) * KEY_BLOCK], block)
        out = part if out is None else out.add_(part)
    return out
