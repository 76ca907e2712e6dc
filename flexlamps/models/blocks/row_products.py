"""Products whose rows keep their bits however many rows share the call (`weight_kind`'s batch
invariance), for the blocks that multiply activations by activations or by weights outside
`linear`: MLA's per-head products, its indexer's sums, a prompt's tokens on a MoE expert.

MKL's fp32 GEMM runs a product of few rows on another kernel, whose sums move with the row
count: every product here has at least `min_rows(inner)` rows (fewer are padded with zeros and
dropped after). How few depends on the CPU and on the inner dimension when the right operand is
a transposed view (keys^T, w.T): on AVX2 CPUs 1-3 rows at any inner size; with MKL's AVX-512
kernels (Intel Xeon) up to 2 rows at 64 inner terms, 5 at 128, 10 at 256, 15 from 512 on (to
4096; 1 and 2 threads; a plain right operand: 1 row only). `attention` keeps its own shape rules
beside this one (its keys' blocks and spans) and takes min_rows from here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# NOTE(exact): changing these needs the exactness tests re-run (test_attention_exact, test_mla_exact)
MIN_ROWS = 4  # MKL's AVX2 kernels run 1-3 rows on another kernel, whose sums move with the step
MAX_MIN_ROWS = 16  # its AVX-512 kernels, up to 15 rows over 512 inner terms or more


def min_rows(inner: int) -> int:
    """The rows a product over `inner` terms is padded to: MIN_ROWS, and more than the rows MKL's
    AVX-512 kernels run apart at this inner size (at most K // 21 + 1 at K = 48-4096: measured 2
    at 64, 5 at 128, 10 at 256), at most MAX_MIN_ROWS. (A pad row costs multiply-adds, not memory.)"""
    return min(MAX_MIN_ROWS, max(MIN_ROWS, inner // 21 + 2))


def rows_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul(a, b) with a's rows (dim -2) padded to `min_rows` of the inner size: a row's
    result then takes the same kernel and summation order however many rows share the product. bf16 / fp16 on the
    CPU multiply in fp32 and round once: torch's 16-bit batched GEMM there is 2-10x slower than
    converting both to fp32 (16 heads of 128 x 512, 1-32 rows, Zen 2)."""
    rows, dtype = a.shape[-2], a.dtype
    if a.device.type == "cpu" and dtype != torch.float32:
        a, b = a.float(), b.float()
    least = min_rows(a.shape[-1])
    if rows < least:
        a = F.pad(a, (0, 0, 0, least - rows))
    return torch.matmul(a, b)[..., :rows, :].to(dtype)
