"""The decode kernel (`flexlamps.kernels.tile_gemv`), in every variant this CPU has: what it computes,
that a row's result does not depend on its batch or the thread count, that the variants agree bit
for bit, that `linear` gives the in-memory and offload engines the same products, and how it is
built, found again and refused."""
from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

from flexlamps.models.blocks import linear as linear_mod
from flexlamps.kernels import loader, tile_gemv
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight
from tests.kernel_variants import assert_rows_alone_as_together, levels, variant_kernel
from tests.unit.test_q6_k_form import _form as q6_k_form

KERNEL = linear_mod.native_kernel()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="this CPU lacks AVX2 + FMA + F16C or no C compiler")
LEVELS = levels(tile_gemv.KERNEL)
# the kernel's result, rounded once to the output's dtype, against the same product in fp64: one
# unit in the last place of the output (fp32 sums in another order may cross a rounding boundary),
# plus that reordering itself, at most K * 2^-24 of the sum of the terms' sizes
ULP = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def _int4(rows: int, cols: int, group: int, dtype: torch.dtype, seed: int = 0) -> Int4Weight:
    gen = torch.Generator().manual_seed(seed)
    return Int4Weight.quantize(torch.randn(rows, cols, generator=gen), group, dtype).kernel_only()


def _int8(rows: int, cols: int, dtype: torch.dtype, with_zero: bool, seed: int = 0) -> Int8Weight:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=gen)
    scale = torch.rand(rows, cols // 32, generator=gen) / 64
    zero = torch.randn(rows, cols // 32, generator=gen) / 64 if with_zero else None
    return Int8Weight.from_codes(codes, scale, 32, dtype, zero=zero)


def _x(rows: int, cols: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    x[0, :32] = 0  # a group of zeros: scale 0, codes 0
    return x.to(dtype)


def _variant(level: str, x_bits: int = tile_gemv.X_BITS) -> tile_gemv.TileGemv:
    """The `level` variant taking x in `x_bits` codes (skipped where this CPU lacks it)."""
    return tile_gemv.TileGemv(variant_kernel(tile_gemv.KERNEL, level).library, level, x_bits)


def _assert_kernel_product(kernel: tile_gemv.TileGemv, w, x: torch.Tensor) -> None:
    x_bits = kernel.x_bits
    rounded = tile_gemv.rounded_like_kernel(x, w.group_size, x_bits).double()
    dense = w.dequantize(torch.float32).double()
    want, size = rounded @ dense.t(), rounded.abs() @ dense.abs().t()
    got = kernel.matmul(w, x)
    assert got.dtype == x.dtype and got.shape == want.shape
    err = (got.double() - want).abs()
    assert (err <= ULP[x.dtype] * want.abs() + x.shape[-1] * 2 ** -24 * size).all(), (err / size).max()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [16, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,group", [((64, 32), 32), ((192, 576), 32), ((576, 1536), 64), ((128, 512), 256)])
def test_int4_is_x_rounded_to_integers_times_the_weight(level, dtype, shape, group, x_bits):
    kernel, w = _variant(level, x_bits), _int4(*shape, group, dtype)
    assert kernel.runs(w, _x(1, shape[1], dtype))
    for rows in (1, 2, 3, 4, 9):
        _assert_kernel_product(kernel, w, _x(rows, shape[1], dtype, seed=rows))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [16, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_zero", [False, True])
def test_int8_is_x_rounded_to_integers_times_the_weight(level, dtype, with_zero, x_bits):
    kernel, w = _variant(level, x_bits), _int8(128, 576, dtype, with_zero)
    assert kernel.runs(w, _x(1, 576, dtype))
    for rows in (1, 2, 3, 6):
        _assert_kernel_product(kernel, w, _x(rows, 576, dtype, seed=rows))


@pytest.mark.parametrize("level", LEVELS)
def test_the_variants_agree_bit_for_bit(level):
    """Exact integer sums and the same fp32 steps: every variant gives the lowest one's bits on
    the weights both take (the lowest takes every tile size torch lays out)."""
    kernel, lowest = _variant(level), _variant(LEVELS[0])
    for w in (_int4(192, 576, 32, torch.bfloat16), _int8(128, 576, torch.float16, True)):
        if kernel.takes(w):
            x = _x(5, 576, w.dtype)
            assert torch.equal(kernel.matmul(w, x), lowest.matmul(w, x))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [16, 8])
@pytest.mark.parametrize("code", [127, -128])
def test_the_largest_groups_do_not_overflow(level, x_bits, code):
    """The largest codes (int8 weights) times x's largest codes of either sign over a group of 256
    inputs: the int32 sums (and 8-bit x's int16 partial sums) stay exact."""
    rows, cols = 64, 512
    codes = torch.full((rows, cols), code, dtype=torch.int8)
    w = Int8Weight.from_codes(codes, torch.full((rows, cols // 256), 1 / 64), 256, torch.float16)
    for sign in (1, -1):  # 2 rows, and 16 (16-bit x: the AMX tiles' two byte halves)
        for rows in (2, 16):
            _assert_kernel_product(_variant(level, x_bits), w, sign * torch.ones(rows, cols, dtype=torch.float16))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_and_prompt_products_agree_bit_for_bit(level, dtype):
    """With 8-bit x the decode product and the prompt product add the same exact sums in the same
    fp32 steps, so a row gets the same bits from either, alone or among few or many (a decode
    call of many rows lays the codes out once, as prompts do)."""
    kernel = _variant(level, 8)
    for w in (_int4(192, 576, 32, dtype), _int4(128, 512, 128, dtype), _int8(128, 576, dtype, True)):
        x = _x(25, w.shape[1], dtype)
        alone = torch.cat([kernel.matmul(w, row) for row in x.split(1)])
        assert torch.equal(kernel.matmul(w, x), kernel.prompt_product(w, x))
        for rows in (3, 9, 25):
            assert torch.equal(kernel.matmul(w, x[:rows]), alone[:rows])


@needs_kernel
def test_rounding_x_costs_a_fraction_of_the_weights_own_error():
    """The kernel's extra error (x to integers per group) is small beside the 4-bit weight's, and
    with 16-bit codes near the bf16 output's own rounding."""
    dense = torch.randn(576, 576, generator=torch.Generator().manual_seed(3))
    w = Int4Weight.quantize(dense, 32, torch.bfloat16).kernel_only()
    x = _x(4, 576, torch.bfloat16)
    exact = x.float() @ dense.t()
    kernel_err = (KERNEL.matmul(w, x).float() - x.float() @ w.dequantize(torch.float32).t()).norm()
    weight_err = (x.float() @ w.dequantize(torch.float32).t() - exact).norm()
    assert kernel_err < 0.1 * weight_err
    assert kernel_err < 0.01 * exact.norm()
    if KERNEL.x_bits == 16:
        rounding = (w.matmul(x).float() - x.float() @ w.dequantize(torch.float32).t()).norm()  # torch's kernel
        assert kernel_err < 1.5 * rounding


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [8, 16])  # 16: an output head's, its codes paired once for many rows
def test_a_row_does_not_depend_on_its_batch_or_the_threads(level, x_bits):
    """11 rows, and 35 (16-bit x on AMX: two 16s on the tiles, 3 rows on the per-row path), of 4-bit
    codes, an int8 split and Q6_K's 6-bit form in groups of 16 (an output head's)."""
    kernel = _variant(level, x_bits)
    gen = torch.Generator().manual_seed(5)
    six = Int8Weight.from_codes(torch.randint(-32, 32, (320, 576), dtype=torch.int8, generator=gen),
                                torch.rand(320, 36, generator=gen) / 64, 16, torch.bfloat16,
                                zero=torch.randn(320, 36, generator=gen) / 64, six_bit=True)
    weights = (_int4(320, 576, 32, torch.bfloat16), _int8(192, 576, torch.bfloat16, True), six)
    for rows in (11, 35):
        assert_rows_alone_as_together(kernel.matmul, weights, _x(rows, 576, torch.bfloat16, seed=rows))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("x_bits", [8, 16])
def test_a_group_gives_each_weight_its_own_products_bits(level, x_bits):
    """Weights of different kinds that read the same x in one call (a layer's q, k and v, the native
    loop's `qkv_apart`): each product's bits are its call's alone, at 1 and 2 threads, on the per-row
    path (1, 5 rows), the prompt kernel's (32: 8-bit x from 8 and 24 rows) and AMX's 16-bit x (32)."""
    kernel = _variant(level, x_bits)
    weights = [_int4(320, 512, 32, torch.bfloat16), _int8(96, 512, torch.bfloat16, True),
               _int4(40, 512, 32, torch.bfloat16, seed=3)]  # 40 rows: a partial last tile
    if x_bits == 8:
        weights += [q6_k_form(72, 512)]
    for rows in (1, 5, 32):
        x = _x(rows, 512, torch.bfloat16, seed=rows)
        want = [kernel.matmul(w, x) for w in weights]
        for threads in (1, 2):
            got = kernel.matmul_group(weights, x, threads)
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), (rows, threads)


@needs_kernel
def test_it_refuses_what_it_cannot_read():
    w = _int4(128, 64, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="does not match"):
        KERNEL.matmul(w, _x(1, 32, torch.bfloat16))
    assert KERNEL.matmul(w, torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 128)  # an empty batch
    assert not KERNEL.runs(w, _x(1, 64, torch.float16))  # not the weight's dtype
    assert not KERNEL.runs(w, _x(1, 64, torch.float32))


@needs_kernel
def test_linear_gives_both_engines_the_same_products():
    """The in-memory engine's twin and the offload engine's plain weight go through the same
    kernel, so their decode products are equal bit for bit."""
    w = _int4(192, 576, 32, torch.bfloat16)
    x = _x(3, 576, torch.bfloat16)
    twin = linear_mod.with_dense_twin(w)
    decode = linear_mod.Phase.DECODE  # decode rows take the kernel at any row count
    assert torch.equal(linear_mod.linear(x, twin, phase=decode), KERNEL.matmul(w, x))
    assert torch.equal(linear_mod.linear(x, w, phase=decode), KERNEL.matmul(w, x))


@needs_kernel
def test_an_output_head_keeps_16_bit_x():
    """A head's products are the logits: its decode rounds x to 16 bits, other matrices' to 8."""
    decode, x = linear_mod.Phase.DECODE, _x(3, 576, torch.bfloat16)
    for w in (_int4(192, 576, 32, torch.bfloat16), _int8(128, 576, torch.bfloat16, True)):
        head = linear_mod.linear(x, linear_mod.as_logits_head(w), phase=decode)
        assert torch.equal(head, _variant(KERNEL.level, 16).matmul(w, x))
        assert torch.equal(linear_mod.linear(x, w, phase=decode), _variant(KERNEL.level, 8).matmul(w, x))
        assert not torch.equal(head, linear_mod.linear(x, w, phase=decode))


def test_switched_off_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(loader.SWITCH_ENV, "0")
    kernels = loader.Kernels(tmp_path)
    monkeypatch.setattr(loader, "chosen", lambda: kernels)
    assert linear_mod.native_kernel() is None


def test_a_cpu_without_the_instructions_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv(loader.variants.VARIANT_ENV, raising=False)  # (a CI run at avx2 sets it; this CPU has none)
    monkeypatch.setattr(loader.build, "cpu_flags", lambda cpuinfo=None: "fpu sse2 avx2 fma avx512f avx512bw".split())
    outcome = loader.load(tile_gemv.KERNEL, tmp_path / "kernels")  # no F16C: no variant at all
    assert outcome.state == "disabled" and "F16C" in outcome.why and not (tmp_path / "kernels").exists()


@needs_kernel
def test_built_once_into_its_folder_and_found_again(tmp_path):
    first = tile_gemv.load(tmp_path)
    built = sorted(p.name for p in tmp_path.iterdir())
    assert first is not None and [n for n in built if n.endswith(".so")] and not [n for n in built if ".tmp" in n]
    stamp = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.so")}
    tile_gemv.load.cache_clear()
    assert tile_gemv.load(tmp_path) is not None
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.so")} == stamp


def test_the_source_ships_with_the_package():
    assert tile_gemv.SOURCE.is_file() and os.path.basename(tile_gemv.SOURCE) == "tile_gemv.c"


@pytest.mark.parametrize("level", LEVELS)
def test_only_a_variant_that_multiplies_the_five_bit_form_has_gguf_q5_held_in_it(level, monkeypatch):
    """The 5-bit form's plane is AVX-512's: an AVX2 process keeps Q5_x as int8 codes it multiplies."""
    from flexlamps.models.loading import in_place

    kernel = _variant(level)
    gen = torch.Generator().manual_seed(4)
    five = Int8Weight.from_codes(torch.randint(-16, 16, (64, 64), dtype=torch.int8, generator=gen),
                                 torch.rand(64, 2, generator=gen) / 64, 32, torch.bfloat16, five_bit=True)
    assert kernel.takes_five_bit == (level == "avx512")
    if five.fifth is not None:  # torch's AVX2 layout (tiles of 32) holds no 5-bit form: plain int8 codes
        assert kernel.takes(five) == kernel.takes_five_bit
    monkeypatch.setattr(in_place, "native_kernel", lambda: kernel)
    assert in_place.packs_five_bit() == (level == "avx512")
    monkeypatch.setattr(in_place, "native_kernel", lambda: None)
    assert not in_place.packs_five_bit()


@needs_kernel
def test_a_plain_weights_decode_product_is_bound_once_and_dropped_with_it(monkeypatch):
    from flexlamps.models.blocks import coded_weights

    made = []
    monkeypatch.setattr(coded_weights, "_fused_for", lambda w, x, real=coded_weights._fused_for: made.append(w) or real(w, x))
    w, x = _int4(64, 64, 32, torch.bfloat16), _x(1, 64, torch.bfloat16).view(1, 1, 64)
    first = linear_mod.linear(x, w)
    assert torch.equal(linear_mod.linear(x, w), first) and torch.equal(first.view(1, 64), KERNEL.matmul(w, x[0]))
    assert len(made) == 1  # the second call found the product bound for this weight
    gone = weakref.ref(w)
    del w, made[:]
    gc.collect()
    assert gone() is None  # the cache held the weight's tensors only, not the weight
