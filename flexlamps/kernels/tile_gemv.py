"""Decode's 4-bit and 8-bit matrix products (`tile_gemv.c`), compiled here on first use in a
variant per instruction set (AVX2 + FMA + F16C, AVX-VNNI, AVX-512 VBMI + VNNI) and loaded with
ctypes.

torch's CPU int4 kernel computes at 15-18 GMAC/s a core, so a decode step that should stream its
weights from memory waits on arithmetic instead. `tile_gemv.c` reads the same weights where they
lie (torch's tile layout: nothing is repacked or held twice) and multiplies them by x rounded to
integers with one scale per group, summed exactly in int32: 1.5-3x faster than torch's kernel on
one row with the weights in cache; streamed from memory (a SmolLM2 step) it reaches 10-16 GB/s of
the probe's 28, so a batch-1 step fell from 17-18 ms to 13-15.

x's codes have 8 bits per group of the weight (`X_BITS`), as llama.cpp rounds x for its block
types: on AVX2 the codes then stay bytes and vpmaddubsw multiplies 32 an instruction, summed in
int16 for 32 inputs (tile_gemv_avx2_x8.h), 1.4-1.6x the 16-bit path's rate (Zen 2, 1 thread, a
2048 x 2048 Q4_0-like matrix: 16.5 against 10.7 GMAC/s). The error grows from the bf16 rounding
of the output (0.166% rms) to about 0.5%; an output head, whose outputs are the logits, keeps
16-bit codes (`Int4Weight.x_bits`, set by `models.blocks.coded_weights.as_logits_head`). With
8-bit x, decode and prompts add the same exact sums in the same fp32 steps, so a decode call of
many rows (AVX2: 8 on 4-bit codes, 6 on an int8 split; AVX-512: 24 and 8) lays each slice of
codes out once for all its rows, as prompts do (the same bits; 1.5x the 16-bit path's rate at
32 rows). With 16-bit x the amx variant does so from 16 rows (in whole 16s, on the AMX tiles: each
code split into two bytes, their exact sums joined, then the per-row path's fp32 steps, so the
same bits; a 1.1B's Q6_K head at 32 rows 1.4-1.5x).
A row's result does not depend on the batch. For Q4_K's form (`Int4Weight.k_scales`) 8-bit x is rounded
per 256 inputs instead, one scale a super-block as llama.cpp's Q8_K (`x_group`).

Prompts (calls of many rows) have their own product on the same codes (`prompt_product`,
tile_gemm.h): x rounded to int8 per group of the weight, as llama.cpp rounds x for its block
types, and each 32-row slice of codes laid out once for all the call's rows so that vpmaddubsw
multiplies 32 pairs an instruction: 3x the 16-bit decode path's rate at 128 rows (Zen 2, 1 thread).
A row's result depends on that row alone there too.

The AVX2 variants take torch's AVX2 layout (tiles of 32 rows) and the AVX-512 one (64), 8- or
16-bit x and 4-bit or int8 codes (not the 5-bit form, whose plane is laid out for AVX-512
registers), and add the same exact sums in the same fp32 steps as the AVX-512 variant: the same bits.
Every variant takes the 6-bit form of codes in [-32, 31] (Q6_K: `Int8Weight.high`, 8 bits a weight
where the split holds 12; 7 where its zeros are 8 times its scales and it holds the scales alone)
and gives it the split's bits: its plane's high parts plus 6 are the split's high nibbles. Q6_K's
form of it (`Int8Weight.k_scales`, KIND_INT6_K: the file's d and sc) takes 8-bit x alone, rounded per
256 inputs (`x_group`), each super-block's sc q x summed exactly and scaled once (tile_scales_k6.h).

`KERNEL` is how `flexlamps.kernels.loader` builds it (once per source, compiler and flags) and
checks it against a plain computation in each dtype and weight kind it takes; callers keep
torch's kernel where the CPU lacks AVX2 + FMA + F16C, no C compiler is found (`$CC`, else cc),
or the build or the check fails (with a warning that says why).
Threads (torch.get_num_threads(), passed each call) split a call by claiming chunks of tiles
(`claim_pool.h`): the caller does not wait for a worker that has not woken, where an OpenMP team
waits at its barrier (a 1.1B decode step at 2 threads on a shared 2-core box: 1.5-1.7 s -> 0.3 s).
Imports torch only.
"""
from __future__ import annotations

import ctypes
import functools
import weakref
from pathlib import Path
from typing import Callable

import torch

from flexlamps.kernels import build, loader, variants
from flexlamps.kernels.loader import require
from quant.int4_tiles import tile_rows
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight

SOURCE = build.SOURCES / "tile_gemv.c"
VARIANTS = (variants.variant("avx2"), variants.variant("avx_vnni"),
            variants.variant("avx512", ("avx512vbmi", "avx512_vnni"), ("-mavx512vbmi", "-mavx512vnni")),
            # the avx512 build whose prompts multiply 4-bit codes on AMX int8 tiles (tile_gemm_amx.h)
            variants.variant("amx", ("avx512vbmi", "avx512_vnni"), ("-mavx512vbmi", "-mavx512vnni")))
TILES = {"avx512": (64,), "amx": (64,)}  # the tile rows a variant takes (the others: torch's AVX2 and AVX-512 layouts)
DTYPES = {torch.bfloat16: 0, torch.float16: 1}  # the activations' dtypes, as the kernel's flag
# the weight's layout, as the kernel's `kind` (KIND_INT6_SCALES: the 6-bit form with its scales alone;
# KIND_INT4_K: 4-bit codes with Q4_K's scales as the file holds them, `Int4Weight.k_scales`)
# KIND_INT6_K: the 6-bit form with Q6_K's scales as the file holds them, `Int8Weight.k_scales`: 8-bit x only)
KIND_INT4, KIND_INT8_SPLIT, KIND_INT5, KIND_INT6, KIND_INT6_SCALES, KIND_INT4_K, KIND_INT6_K = 0, 1, 2, 3, 4, 5, 6
X_BITS = 8  # x's codes for decode: 8 bits (llama.cpp's rounding of x; twice the 16-bit rate on AVX2) or 16


class GemvPart(ctypes.Structure):
    """One weight of `TileGemv.matmul_group` (tile_gemv.c's GemvPart: flexlamps_tile_gemv's arguments)."""
    _fields_ = [("codes", ctypes.c_void_p), ("plane", ctypes.c_void_p), ("scale_zero", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("n", ctypes.c_int64), ("cols", ctypes.c_int64), ("group", ctypes.c_int64),
                ("tile", ctypes.c_int64), ("kind", ctypes.c_int32), ("x_bits", ctypes.c_int32)]


class TileGemv:
    """The loaded kernel in one variant (`level`): `runs(w, x)` says whether it takes a weight and
    activations, `matmul(w, x)` computes x @ w.T."""

    def __init__(self, library: ctypes.CDLL, level: str = "avx512", x_bits: int = X_BITS):
        if x_bits not in (8, 16):
            raise ValueError(f"tile_gemv: x_bits must be 8 or 16, got {x_bits} for {level}")
        fn = library.flexlamps_tile_gemv
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_int] * 4
        gemm = library.flexlamps_tile_gemm
        gemm.restype = ctypes.c_int
        gemm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_int] * 3
        self.library, self._fn, self._gemm, self.x_bits, self.level = library, fn, gemm, x_bits, level
        self.tiles = TILES.get(level, (32, 64))
        # prompts multiply the codes on AMX int8 tiles (tile_gemm_amx.h) here, with the bits of every
        # other variant's prompt product (`coded_weights.prompts_take_codes`)
        self.amx_prompts = level == "amx"
        # (not amx's: the prompt product takes no 5-bit form, and there a Q5_x held in the 6-bit form
        # runs prompts on the codes too, with no dense twin)
        self.takes_five_bit = level == "avx512"  # the 5-bit form's plane is laid out for AVX-512 registers

    def takes(self, w: Int4Weight | Int8Weight) -> bool:
        """Whether the kernel takes `w`: a CPU weight in tiles of torch's layout (of rows this variant
        takes; the last one's codes padded to the tile where the rows do not fill it), in bf16 or
        fp16, its groups a multiple of 4 inputs."""
        if isinstance(w, Int8Weight) and w.k_scales and (w.x_bits or self.x_bits) != 8:
            return False  # (Q6_K's form's products are for 8-bit x: `as_logits_head` gives a head the pairs)
        return self._takes_codes(w)

    def _takes_codes(self, w: Int4Weight | Int8Weight) -> bool:
        split = w.split if isinstance(w, Int8Weight) else w
        rows, cols = split.shape
        tile = tile_rows(cols)
        return (split.kernel_codes is not None and split.device.type == "cpu" and split.dtype in DTYPES
                and tile in self.tiles and split.kernel_codes.shape[0] == -(-rows // tile) * tile
                and split.group_size % 4 == 0
                and (self.takes_five_bit or not (isinstance(w, Int8Weight) and w.fifth is not None)))

    def runs(self, w: Int4Weight | Int8Weight, x: torch.Tensor) -> bool:
        """Whether the kernel takes `w` with activations `x` (on the CPU, in the weight's dtype)."""
        return x.device.type == "cpu" and x.dtype == w.dtype and self.takes(w)

    def takes_prompt(self, w: Int4Weight | Int8Weight) -> bool:
        """Whether `prompt_product` takes `w`: as `takes`, with 4-bit or int8 codes (the split or
        the 6-bit form, not the 5-bit one) in groups of at most 32 inputs or of whole 32s."""
        group = (w.split if isinstance(w, Int8Weight) else w).group_size
        return (self._takes_codes(w) and not (isinstance(w, Int8Weight) and w.fifth is not None)
                and (group <= 32 or group % 32 == 0))

    def runs_prompt(self, w: Int4Weight | Int8Weight, x: torch.Tensor) -> bool:
        """Whether `prompt_product` takes `w` with activations `x` (on the CPU, in the weight's dtype)."""
        return x.device.type == "cpu" and x.dtype == w.dtype and self.takes_prompt(w)

    def matmul(self, w: Int4Weight | Int8Weight, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) @ w.T, for a weight and activations `runs` takes; x rounded to `w.x_bits`
        where the weight sets it, else to `x_bits`."""
        return self.bind(w)(x)

    def matmul_group(self, ws: list, x: torch.Tensor, threads: int | None = None) -> list[torch.Tensor]:
        """x (rows, K) contiguous @ w.T for each weight of `ws` (up to 4, each one `runs` takes) in one
        call, as the native loop runs a layer's q, k and v of different kinds: each product is
        `matmul`'s (the same bits), the threads claim the tiles of all of them from one counter."""
        outs = [torch.empty(x.shape[0], layout_of(w)[0].shape[0], dtype=x.dtype) for w in ws]
        parts = (GemvPart * len(ws))()
        for part, w, out in zip(parts, ws, outs):
            split, plane, kind = layout_of(w)
            part.codes, part.scale_zero, part.out = split.kernel_codes.data_ptr(), split.scale_zero.data_ptr(), \
                out.data_ptr()
            part.plane = None if plane is None else plane.data_ptr()
            part.n, part.cols, part.group, part.tile = split.shape[0], w.shape[1], split.group_size, \
                tile_rows(split.shape[1])
            part.kind, part.x_bits = kind, w.x_bits or self.x_bits
        if self.library.flexlamps_tile_gemv_group(parts, len(ws), ctypes.c_void_p(x.data_ptr()),
                                                  ctypes.c_int64(x.shape[0]), DTYPES[x.dtype],
                                                  threads or torch.get_num_threads()):
            raise ValueError(f"tile_gemv: the kernel refused x {tuple(x.shape)} with one of {ws!r}")
        return outs

    def prompt_product(self, w: Int4Weight | Int8Weight, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) @ w.T for prompts (`runs_prompt`): x rounded to int8 per group (`rounded_like_kernel`
        with 8 bits), the codes multiplied where they lie, many rows a pass (tile_gemm.h)."""
        split, plane, kind = layout_of(w)
        n, cols = split.shape[0], w.shape[1]
        rows, out = self._rows_and_out(x, cols, n, w)
        if rows.shape[0] and self._gemm(split.kernel_codes.data_ptr(), None if plane is None else plane.data_ptr(),
                                        split.scale_zero.data_ptr(), rows.data_ptr(), out.data_ptr(), n, cols,
                                        split.group_size, rows.shape[0], tile_rows(split.shape[1]), DTYPES[x.dtype],
                                        kind, torch.get_num_threads()):
            raise ValueError(f"tile_gemv: the prompt kernel refused x {tuple(x.shape)} with {w!r}")
        return out if x.dim() == 2 else out.view(*x.shape[:-1], n)

    @staticmethod
    def _rows_and_out(x: torch.Tensor, cols: int, n: int, w) -> tuple[torch.Tensor, torch.Tensor]:
        """x's rows as a contiguous (rows, cols) tensor, and the (rows, n) output to write."""
        if x.shape[-1] != cols:  # the kernel would read past x
            raise ValueError(f"tile_gemv: x {tuple(x.shape)} does not match the weight {w!r}")
        rows = x if x.dim() == 2 else x.reshape(-1, cols)  # (a reshape costs as much as the kernel on small rows)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        return rows, torch.empty(rows.shape[0], n, dtype=x.dtype)

    def bind(self, w: Int4Weight | Int8Weight) -> Callable[[torch.Tensor], torch.Tensor]:
        """`matmul` for one weight, its arguments worked out once (a decode step makes ~120 calls,
        each a few microseconds of Python: x's rows are read where they lie when contiguous, and
        the output is made in its final shape). The product holds the weight's tensors (so the
        pointers stay valid), not the weight: a cache keyed weakly by the weight may keep it."""
        split, plane, kind = layout_of(w)
        fn, n, cols, group, x_bits = self._fn, split.shape[0], w.shape[1], split.group_size, w.x_bits or self.x_bits
        tile = tile_rows(split.shape[1])
        held = (split.kernel_codes, split.scale_zero, plane)
        codes, scale_zero, plane = (None if t is None else t.data_ptr() for t in held)
        described = weakref.ref(w)  # for a refusal's message

        def product(x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            if shape[-1] != cols or not x.is_contiguous():  # else the rows are read where they lie
                x = self._rows_and_out(x, cols, n, described())[0]
            out = torch.empty(shape[:-1] + (n,), dtype=x.dtype)
            rows = x.numel() // cols
            if rows and fn(codes, plane, scale_zero, x.data_ptr(), out.data_ptr(), n, cols, group, rows, tile,
                           DTYPES[x.dtype], kind, x_bits, torch.get_num_threads()):
                raise ValueError(f"tile_gemv: the kernel refused x {tuple(shape)} with {described()!r}")
            return out

        product.held = held
        return product


def layout_of(w: Int4Weight | Int8Weight) -> tuple[Int4Weight, torch.Tensor | None, int]:
    """The 4-bit tiles the kernel reads (the split's, or the 5- or 6-bit form's nibbles), the form's
    plane (None: no plane) and the kernel's `kind` for `w`."""
    if not isinstance(w, Int8Weight):
        return w, None, KIND_INT4_K if w.k_scales else KIND_INT4
    if w.fifth is not None:
        return w.split, w.fifth, KIND_INT5
    if w.high is not None:
        return w.split, w.high, KIND_INT6_K if w.k_scales else KIND_INT6_SCALES if w.scales_alone else KIND_INT6
    return w.split, None, KIND_INT8_SPLIT


def _check(kernel: TileGemv) -> None:
    """The kernel against x rounded as it rounds it, times the dequantized weight, in fp32, for each
    weight kind and activation dtype it takes (a miscompile or a CPU that misreports its flags
    fails here, not in a user's outputs)."""
    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for w in _check_weights(gen, dtype, kernel):
            x = torch.randn(3, w.shape[1], generator=gen).to(dtype)
            require(kernel.runs(w, x), f"tile_gemv: the check's weight is not taken: {w!r}")
            want = (rounded_like_kernel(x, x_group(w, kernel.x_bits), kernel.x_bits)
                    @ w.dequantize(torch.float32).t()).to(dtype)
            _require_close(kernel.matmul(w, x), want, f"the kernel's check failed for {w!r} in {dtype}")
            if kernel.runs_prompt(w, x):
                want = (rounded_like_kernel(x, x_group(w, 8), 8) @ w.dequantize(torch.float32).t()).to(dtype)
                _require_close(kernel.prompt_product(w, x), want, f"the prompt kernel's check failed for {w!r} in {dtype}")


def _require_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.float(), want.float()
    error = (got - want).abs().max().item()
    require(bool(torch.allclose(got, want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())),
            f"tile_gemv: {what} (max error {error:.3g})")


def _check_weights(gen: torch.Generator, dtype: torch.dtype, kernel: TileGemv) -> tuple:
    """One weight of each kind the kernel takes: 4-bit (with pairs, and Q4_K's scales), int8 in two
    4-bit halves, the 6-bit form, the 5-bit form (on AVX-512)."""
    def int8(low: int, high: int, five_bit: bool, six_bit: bool = False) -> Int8Weight:
        return Int8Weight.from_codes(torch.randint(low, high, (64, 64), dtype=torch.int8, generator=gen),
                                     torch.rand(64, 2, generator=gen) / 64, 32, dtype,
                                     zero=torch.randn(64, 2, generator=gen) / 64, five_bit=five_bit, six_bit=six_bit)
    k4 = Int4Weight.from_k_blocks(torch.randint(0, 16, (64, 256), dtype=torch.uint8, generator=gen),
                                  torch.rand(64, 1, generator=gen) / 64, torch.rand(64, 1, generator=gen) / 64,
                                  torch.randint(0, 64, (64, 8), generator=gen), torch.randint(0, 64, (64, 8), generator=gen),
                                  dtype)
    k6 = Int8Weight.from_k6_blocks(torch.randint(-32, 32, (64, 256), dtype=torch.int8, generator=gen),
                                   torch.rand(64, 1, generator=gen) / 4096,
                                   torch.randint(-128, 128, (64, 16), dtype=torch.int8, generator=gen), dtype)
    weights = (Int4Weight.quantize(torch.randn(128, 64, generator=gen), 32, dtype), k4, int8(-128, 128, False),
               int8(-32, 32, False, True), int8(-16, 16, True), k6)
    return tuple(w for w in weights if kernel.takes(w)
                 or not (isinstance(w, Int8Weight) and (w.fifth is not None or w.k_scales)))


def _unfit(variant: variants.Variant) -> str | None:
    """Why this process cannot run `variant`: torch lays its int4 tiles out by its own CPU level (64
    rows at AVX-512, 32 at AVX2: $ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU), and the AVX-512
    variants take 64 only. None where it can (or torch has no int4 tiles: no weight is in them)."""
    tile = tile_rows(256)
    if tile is None or tile in TILES.get(variant.level, (32, 64)):
        return None
    return (f"torch runs at {torch.backends.cpu.get_cpu_capability()} ($ATEN_CPU_CAPABILITY), where its int4 "
            f"tiles have {tile} rows; the {variant.level} variant takes {' or '.join(map(str, TILES[variant.level]))}")


KERNEL = loader.Kernel("tile_gemv", SOURCE, VARIANTS, "the decode kernel", "4-bit decode runs torch's slower int4 kernel",
                       TileGemv, _check, unfit=_unfit)


@functools.lru_cache(maxsize=None)
def load(folder: Path, level: str | None = None) -> TileGemv | None:
    """The kernel (in its variant for `level`, None: the process's) built into (or found in)
    `folder` and checked, or None where it cannot run here (the process's own:
    `loader.chosen().get("tile_gemv")`)."""
    return loader.load(KERNEL, Path(folder), level).kernel


def x_group(w: Int4Weight | Int8Weight, bits: int = X_BITS) -> int:
    """The inputs x is rounded in blocks of (one scale each) for `w` with codes of `bits` bits:
    a super-block of 256 for Q4_K's and Q6_K's forms (`Int4Weight.k_scales`, `Int8Weight.k_scales`) with
    8-bit x, as llama.cpp rounds x (Q8_K) for its K-quants (tile_gemv.c's `x_block`); else the weight's group."""
    return 256 if w.k_scales and bits == 8 and w.shape[1] % 256 == 0 else w.group_size


def rounded_like_kernel(x: torch.Tensor, group: int, bits: int = X_BITS) -> torch.Tensor:
    """x (rows, K) in fp32 as the kernel rounds it: each group to codes of `bits` bits times
    max |x| / (2^(bits-1) - 1). Divisions by a tensor, not a number: torch turns `c / t` and
    `t / c` into products with a reciprocal, whose rounding differs from the kernel's division."""
    groups = x.float().reshape(x.shape[0], -1, group)
    amax = groups.abs().amax(-1, keepdim=True)
    top = torch.full_like(amax, 2.0 ** (bits - 1) - 1)
    inverse = torch.where(amax > 0, top / amax, torch.zeros_like(amax))
    return (torch.round(groups * inverse) * (amax / top)).reshape(x.shape)
