"""Products whose rows keep their bits however many rows share the call (`weight_kind`'s batch
invariance), for the blocks that multiply activations by activations or by weights outside
`linear`: MLA's per-head products, its indexer's sums, a prompt's tokens on a MoE expert.

MKL's fp32 GEMM runs 1-3 rows on another kernel, whose sums move with the row count: every
product here has at least `MIN_ROWS` rows (fewer are padded with zeros and dropped after).
`attention` keeps its own shape rules beside this one (its keys' blocks and spans) and takes
MIN_ROWS from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# NOTE(exact): changing it needs the exactness tests re-run (test_attention_exact, test_mla_exact)
MIN_ROWS = 4  # MKL runs 1-3 query rows on another kernel, whose sums move with the step


def rows_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul(a, b) with a's rows (dim -2) padded to MIN_ROWS: a row's result then takes
    the same kernel and summation order however many rows share the product. bf16 / fp16 on the
    CPU multiply in fp32 and round once: torch's 16-bit batched GEMM there is 2-10x slower than
    converting both to fp32 (16 heads of 128 x 512, 1-32 rows, Zen 2)."""
    rows, dtype = a.shape[-2], a.dtype
    if a.device.type == "cpu" and dtype != torch.float32:
        a, b = a.float(), b.float()
    if rows < MIN_ROWS:
        a = F.pad(a, (0, 0, 0, MIN_ROWS - rows))
    return torch.matmul(a, b)[..., :rows, :].to(dtype)
