"""Attention in bf16 / fp16 (`attention.c`), compiled on first use in an AVX2 and an AVX-512 variant
(one source over native_simd.h's vectors; vdpbf16ps paths on AVX-512 BF16 CPUs, in
attention_bf16_avx512.h).

torch's flash kernel spends ~60 us a layer on one decode row of SmolLM2 (3 kv heads, 160 keys)
and the batched products ~650 us on 32 rows, where the keys and values take a few us to read:
the work is many tiny products. The kernel scores each kv head's group of queries against its
keys once, in fp32 (vdpbf16ps on bf16 pairs where the CPU has AVX512_BF16), rounds
exp(score - max) to the activations' dtype (the dominant key's weight is exactly 1), sums the
weighted values in fp32 and divides by the weights' sum, rounding the result once: the flash
kernel's arithmetic, within `attention.BF16_TOLERANCE` of it and of float32. Keys after a
query's last visible one are not read, so a causal prompt reads half of them (32 prompts of 128
tokens: 23 -> 15 ms a layer). A query's result depends only on its own query, keys, values and
mask: not on the other rows or positions, the thread count or the padded span. A query that
sees no key gets zeros.

`KERNEL` is how `flexlamps.kernels.loader` builds it and checks it against `reference` in each
dtype (with vdpbf16ps and without); attention keeps torch's kernels, with a warning that says why,
where the CPU lacks AVX2 + FMA + F16C, no compiler is found, or the build or check fails.
$FLEXLAMPS_NATIVE_KERNELS=0 turns it off.
"""
from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.loader import require

SOURCE = build.SOURCES / "attention.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx512"))
BF16_DOT_FLAGS = ("avx512_bf16",)  # bf16 pair products summed in fp32 (vdpbf16ps): nothing converted first
DTYPES = {torch.bfloat16: 0, torch.float16: 1}
MAX_HEAD_DIM, MAX_GROUP = 256, 16
_Strides = ctypes.c_int64 * 12  # q's, keys' and values' (row, head, position), mask's (row, query, key)


class NativeAttention:
    """The loaded kernel: `takes(q, keys)` says whether it runs a call, `__call__` runs it."""

    def __init__(self, library: ctypes.CDLL, bf16_dot: bool = False, level: str = "avx512"):
        fn = library.flexlamps_attention
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6 + [ctypes.POINTER(_Strides), ctypes.c_float] + [ctypes.c_int] * 3
        self.library, self._fn, self.bf16_dot, self.level = library, fn, int(bf16_dot), level

    @staticmethod
    def takes(q: torch.Tensor, keys: torch.Tensor) -> bool:
        """q (n, heads, T, d) in bf16 or fp16 and keys (n, kv_heads, S, d) on the CPU (keys and
        values in another dtype are rounded to q's first)."""
        n, heads, t, d = q.shape
        kv = keys.shape[1]
        return (q.device.type == "cpu" and q.dtype in DTYPES and keys.device.type == "cpu" and d % 16 == 0
                and d <= MAX_HEAD_DIM and heads % kv == 0 and heads // kv <= MAX_GROUP and keys.shape[2] > 0
                and keys.shape[0] == n and keys.shape[3] == d)

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                 scale: float | None = None) -> torch.Tensor:
        """softmax(q keys^T * scale, masked) @ values for q (n, heads, T, d), keys and values
        (n, kv_heads, S, d) (any strides but the last), mask (n, T, S) bool -> (n, heads, T, d);
        scale None: 1 / sqrt(d); a query that sees no key gets zeros."""
        n, heads, t, d = q.shape
        kv, span = keys.shape[1], keys.shape[2]
        if values.shape != keys.shape:  # the kernel would read past them
            raise ValueError(f"native_attention: values {tuple(values.shape)} differ from keys {tuple(keys.shape)}")
        if keys.dtype != q.dtype or values.dtype != q.dtype:  # (a no-op `to` still costs a dispatch)
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        if q.stride(-1) != 1:
            q = q.contiguous()
        if keys.stride(-1) != 1:
            keys = keys.contiguous()
        if values.stride(-1) != 1:
            values = values.contiguous()
        if mask.dtype != torch.bool:
            mask = mask.to(torch.bool)
        if mask.shape != (n, t, span):  # one mask row for all of a row's queries: broadcast (stride 0)
            mask = mask.expand(n, t, span)
        out = torch.empty(n, heads, t, d, dtype=q.dtype)
        qs, ks, vs, ms = q.stride(), keys.stride(), values.stride(), mask.stride()
        strides = _Strides(qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], ms[0], ms[1], ms[2])
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        if n and self._fn(q.data_ptr(), keys.data_ptr(), values.data_ptr(), mask.data_ptr(), out.data_ptr(), n, heads,
                          kv, t, span, d, strides, scale, DTYPES[q.dtype], self.bf16_dot, torch.get_num_threads()):
            raise ValueError(f"native_attention: the kernel refused q {tuple(q.shape)}, keys {tuple(keys.shape)}")
        return out


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in torch: fp32 scores, exp(score - max) rounded to q's dtype,
    fp32 sums with the values divided by the rounded weights' sum, rounded once."""
    group = q.shape[1] // keys.shape[1]
    k, v = (x.float().repeat_interleave(group, dim=1) for x in (keys, values))
    scores = ((q.float() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).masked_fill(~mask[:, None], float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True)).to(q.dtype).float()
    return ((weights @ v) / weights.sum(-1, keepdim=True)).to(q.dtype)


def _check(kernel: NativeAttention) -> None:
    """The kernel against `reference`: grouped heads over a strided cache view, a decode with a
    masked tail and a causal prompt chunk after cached keys, in each dtype; with vdpbf16ps, the
    plain path too (a head size that is no multiple of 32 takes it)."""
    gen = torch.Generator().manual_seed(0)
    for variant in (kernel, NativeAttention(kernel.library, level=kernel.level)) if kernel.bf16_dot else (kernel,):
        for dtype in DTYPES:
            cache = torch.randn(2, 3, 2, 40, 64, generator=gen).to(dtype)
            keys, values = cache[0, :, :, :37], cache[1, :, :, :37]
            decode = torch.arange(37)[None, None, :] <= torch.tensor([36, 20, 0])[:, None, None]
            chunk = (torch.arange(37)[None, :] <= torch.arange(32, 37)[:, None]).expand(3, 5, 37)
            for mask in (decode, chunk):
                q = torch.randn(3, 6, mask.shape[1], 64, generator=gen).to(dtype)
                got, want = variant(q, keys, values, mask), reference(q, keys, values, mask)
                error = (got.float() - want.float()).abs().max().item()
                require(error <= 2.0 ** -7 * values.float().abs().max().item(),  # NaN fails too
                        f"native_attention: the kernel's check failed in {dtype} (max error {error:.3g})")


def _make(library, level: str) -> NativeAttention:
    return NativeAttention(library, level == "avx512" and build.cpu_has_flags(BF16_DOT_FLAGS), level)


KERNEL = loader.Kernel("attention", SOURCE, VARIANTS, "the attention kernel", "attention runs torch's kernels",
                       _make, _check)


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> NativeAttention | None:
    """The kernel built into (or found in) `folder` and checked, or None where it cannot run here
    (the process's own: `loader.chosen().get("attention")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel
