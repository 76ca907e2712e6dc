"""`attention(q, keys, values, mask)`: the attention every KV cache calls once it has its keys.

torch's `scaled_dot_product_attention` runs it, except for decode (one query per row) in
bf16/fp16 on the CPU: there a grouped-query product is used, since torch's CPU flash kernel in
bf16 measured 1.4x slower for one decode row and 3.8x slower for 32 (SmolLM2 shapes, span
~150, 1 thread, Zen 4; prompts of 128 tokens are 1.1-1.7x faster in the flash kernel). Scores and softmax run in fp32 (as the flash kernel
accumulates); the probabilities are rounded to the input dtype for the product with the
values, as the flash kernel does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (n, heads, T, d), keys/values (n, kv_heads, S, d), mask (n, T, S) bool (True: attend)
    -> (n, heads, T, d)."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    if q.dtype == torch.float32 or q.device.type != "cpu" or q.shape[2] != 1:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], enable_gqa=heads != kv_heads)
    n, _, t, d = q.shape
    span = keys.shape[2]
    group = heads // kv_heads
    grouped = q.reshape(n, kv_heads, group * t, d).float()  # heads h*group..h*group+group-1 read kv head h
    scores = torch.matmul(grouped, keys.float().transpose(-1, -2)).mul_(1.0 / math.sqrt(d))  # (n, kv, group*T, S)
    scores = scores.view(n, kv_heads, group, t, span).masked_fill_(~mask[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype).view(n, kv_heads, group * t, span)
    return torch.matmul(probs, values).view(n, heads, t, d)
