"""Which matrices a GGUF file's blocks are computed in place for, and in what form.

With 16-bit activations, a matrix the file holds in 4-bit blocks (Q4_0 / Q4_1 / Q4_K) is kept as
an `Int4Weight` and one in Q8_0 / Q5_x / Q6_K as an `Int8Weight` (Q6_K and Q5_x in the 6-bit form
where our kernel runs: `packs_six_bit`), both multiplied on their codes
(`models.blocks.coded_weights`); a quantized output head stays its blocks too (a tied one as the
embedding table's, under "lm_head", beside the dense table the lookup reads). Every executor
keeps the same matrices in the same form (`in_place_form`), so they run the same kernels and
give the same bits: the in-memory one (`checkpoint.read_all`) and the offload one, which sizes
its tiers from `CodedMatrix` descriptions (`coded_matrix`: the bytes `gguf_codes.coded_nbytes` gives,
the planner's formula, without reading the file or building anything of the matrix's size).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch

from flexlamps.kernels import int8_gemm
from flexlamps.models.blocks.linear import native_kernel
from flexlamps.models.loading.gguf_blocks import (BLOCK, int4_blocks, int8_blocks, is_int4_block_type, q4_k_parts,
                                                 q6_k_parts)
from flexlamps.models.loading.gguf_codes import KERNEL_TILE, TIED_HEAD, CodeForms, coded_nbytes, coded_specs
from flexlamps.models.loading.gguf_tensors import unpermute_rows
from flexlamps.models.weight_specs import WeightSpec
from placement.cost_memory import BUILD_WEIGHTS
from quant.int4_tiles import tile_rows
from quant.int4_weight import KERNEL_DTYPES, Int4Weight
from quant.int8_weight import FIVE_BIT_TILE, Int8Weight

# the lowest int8 code of each type the file's blocks give (a sample's codes: its 5-bit form or not)
_LOWEST_CODE = {"Q8_0": -128, "Q6_K": -32}  # the 5-bit types': -16


def packs_five_bit() -> bool:
    """Whether `GGUFReader.read_int8` holds 5-bit codes (Q5_x) in 5 bits (0.6 of the split's bytes):
    where our decode kernel runs in a variant that multiplies that form (AVX-512's; elsewhere Q5_x
    stay int8 codes the AVX2 variant takes). The weight cache keys by it."""
    kernel = native_kernel()
    return kernel is not None and kernel.takes_five_bit


def _five_bit_for(cols: int) -> bool:
    """`packs_five_bit` for a matrix of `cols` inputs: its prompts on that variant run the int8 GEMM
    (the prompt product takes no 5-bit form), so a width that GEMM does not take keeps the 6-bit
    form, whose prompts run on the codes, rather than a dense twin."""
    return packs_five_bit() and int8_gemm.takes_width(cols)


def packs_six_bit() -> bool:
    """Whether `GGUFReader.read_int8` holds codes that fit 6 bits (Q6_K; Q5_x where they are not
    held in 5) in the 6-bit form (2/3 of the split's bytes): where our decode kernel runs, in any
    variant (torch's int4 kernel takes no Q6_K groups of 16). The weight cache keys by it."""
    return native_kernel() is not None


def keeps_k_scales() -> bool:
    """Whether a Q4_K matrix keeps its scales as the file holds them (`Int4Weight.from_k_blocks`:
    4.625 bits a weight, exact fp32 scales): where our kernel runs, in any variant (torch's int4
    kernel reads (scale, zero) pairs). The weight cache keys by it (`packs_six_bit`'s rule)."""
    return native_kernel() is not None


def keeps_q6_k_scales() -> bool:
    """Whether a Q6_K matrix keeps its scales as the file holds them (`Int8Weight.from_k6_blocks`: its
    8-bit-x products a super-block's exact int32 sum and one fp32 step, llama.cpp's Q6_K x Q8_K): where
    it takes the 6-bit form (`packs_six_bit`), our kernel reading the file's scales (`keeps_k_scales`)."""
    return keeps_k_scales() and packs_six_bit()


def int4_from_blocks(codes, scale, zero, dtype: torch.dtype) -> Int4Weight:
    """A 4-bit matrix from its blocks' codes, scales and zero points (`gguf_blocks.int4_blocks`)."""
    return Int4Weight.from_codes(codes, scale, zero, BLOCK, dtype)


def int4_matrix(raw, type_name: str, shape: tuple[int, int], dtype: torch.dtype, rows=None) -> Int4Weight:
    """A Q4_0 / Q4_1 / Q4_K tensor's raw bytes as the engine keeps it: a Q4_K's scales as the file
    holds them where our kernel runs (`keeps_k_scales`), else (scale, zero) pairs (`int4_blocks`);
    `rows` (optional) maps each row-first part (a llama GGUF's q / k rows un-interleaved)."""
    k_form = type_name == "Q4_K" and keeps_k_scales()
    parts = q4_k_parts(raw, shape) if k_form else int4_blocks(raw, type_name, shape)
    parts = parts if rows is None else tuple(rows(part) for part in parts)
    return Int4Weight.from_k_blocks(*parts, dtype) if k_form else int4_from_blocks(*parts, dtype)


def int8_from_blocks(codes, scale, zero, dtype: torch.dtype, whole_rows: int | None = None) -> Int8Weight:
    """An int8-code matrix from its blocks' codes, scales and zero points (`gguf_blocks.int8_blocks`);
    `whole_rows`: the rows of the matrix they are a part of (its 5-bit form or not: whole tiles)."""
    whole_rows = codes.shape[0] if whole_rows is None else whole_rows
    five_bit = _five_bit_for(codes.shape[1]) and whole_rows % KERNEL_TILE == 0
    return Int8Weight.from_codes(codes, scale, codes.shape[1] // scale.shape[1], dtype, zero=zero,
                                 five_bit=five_bit, six_bit=packs_six_bit())


def int8_matrix(raw, type_name: str, shape: tuple[int, int], dtype: torch.dtype, rows=None,
                whole_rows: int | None = None) -> Int8Weight:
    """A Q8_0 / Q5_x / Q6_K tensor's raw bytes as the engine keeps it: a Q6_K's scales as the file
    holds them where our kernel runs (`keeps_k_scales`: the 6-bit form with `Int8Weight.k_scales`),
    else codes with a scale (and zero) a group (`int8_blocks`); `rows` (optional) maps each row-first
    part (a llama GGUF's q / k rows un-interleaved); `whole_rows` as `int8_from_blocks`'."""
    k_form = type_name == "Q6_K" and keeps_q6_k_scales()
    parts = q6_k_parts(raw, shape) if k_form else int8_blocks(raw, shape, type_name)
    parts = parts if rows is None else tuple(None if part is None else rows(part) for part in parts)
    return Int8Weight.from_k6_blocks(*parts, dtype) if k_form else int8_from_blocks(*parts, dtype, whole_rows)


def build_rows(cols: int, unit: int = KERNEL_TILE) -> int:
    """Rows of a matrix of `cols` inputs whose form `blocks_matrix` builds at a time: whole units
    (kernel tiles, or tiles and heads), about BUILD_WEIGHTS weights."""
    return max(unit, BUILD_WEIGHTS // cols // unit * unit)


def blocks_matrix(read, type_name: str, shape: tuple[int, int], dtype: torch.dtype, heads: int | None = None,
                  piece: tuple[int, int] | None = None) -> Int4Weight | Int8Weight:
    """The (N, K) matrix of GGUF `type_name` blocks as the engine keeps it (`int4_matrix` /
    `int8_matrix`), built `build_rows` rows at a time from `read(start, stop)` (the file's bytes of
    those rows) and stacked as built whole (`_stacked`: the same form, the same bits); `piece`
    (start, stop): those rows alone, as the whole's `rows(start, stop)` holds them (a table's piece,
    cut on whole tiles). `heads`: a llama GGUF's q / k rows, interleaved within each of that many
    heads (`unpermute_rows`), built in parts of whole heads."""
    total, cols = shape
    start, stop = piece or (0, total)
    if start % KERNEL_TILE or not 0 <= start < stop <= total:
        raise ValueError(f"blocks_matrix: rows {start}:{stop} of {total} do not start a kernel tile")
    int4 = is_int4_block_type(type_name)
    head = None if heads is None else total // heads
    unmixed = None if heads is None else (lambda part: unpermute_rows(part, len(part) // head))  # whole heads
    if tile_rows(cols) is None:  # no tiles to stack
        if piece is not None:
            raise ValueError(f"blocks_matrix: rows {piece} of a matrix read whole")
        return (int4_matrix if int4 else int8_matrix)(read(0, total), type_name, shape, dtype, unmixed)
    step = build_rows(cols, KERNEL_TILE if head is None else math.lcm(KERNEL_TILE, head))
    bounds = [(first, min(first + step, stop)) for first in range(start, stop, step)]

    def part(first: int, last: int) -> Int4Weight | Int8Weight:
        if not int4:
            return int8_matrix(read(first, last), type_name, (last - first, cols), dtype, unmixed, whole_rows=total)
        w = int4_matrix(read(first, last), type_name, (last - first, cols), dtype, unmixed)
        return w if len(bounds) == 1 else w.kernel_only()  # the plain codes beside the tiles where one part

    return _stacked(part, bounds)


def _grown(w) -> dict[str, tuple[torch.Tensor, int, int]]:
    """A form's tensors that grow with its rows: {name: (tensor, its rows' dim, rows an index)}."""
    split = w if isinstance(w, Int4Weight) else w.split
    out = {"kernel": (split.kernel_codes, 0, 1), "scale_zero": (split.scale_zero, 1, 1)}
    if isinstance(w, Int8Weight) and w.fifth is not None:
        out["fifth"] = (w.fifth, 0, FIVE_BIT_TILE)
    if isinstance(w, Int8Weight) and w.high is not None:
        out["high"] = (w.high, 0, 1)
    return out


def _tile(w) -> int:
    """Rows a tile of `w`'s kernel layout holds (the split's: twice the inputs; the 5-bit form's: 64)."""
    if isinstance(w, Int8Weight) and w.fifth is not None:
        return FIVE_BIT_TILE
    return tile_rows(w.shape[1] * (2 if isinstance(w, Int8Weight) and w.high is None else 1))


def _stacked(part, bounds: list[tuple[int, int]]) -> Int4Weight | Int8Weight:
    """The parts `part(start, stop)` of one matrix's rows `bounds` (whole tiles each but the last,
    whose tiles are padded as the whole's are), built one at a time into the whole form's tensors:
    what building it whole gives, holding one part's transients beside it. Parts in two forms (Q8_0
    codes some of which fit 6 bits) or holding plain codes are stacked as the class does; the 6-bit
    form's scales alone beside pairs as pairs (a zero 8 times its scale in some parts, as the whole)."""
    first = part(*bounds[0])
    if len(bounds) == 1:
        return first
    rows = bounds[-1][1] - bounds[0][0]
    out = None
    for i, (start, _) in enumerate(bounds):
        w = first if i == 0 else part(*bounds[i])
        grown = _grown(w)
        if (w if isinstance(w, Int4Weight) else w.split).codes is not None or (out or grown).keys() != grown.keys():
            return type(first).cat([part(*b) for b in bounds])
        if out is None:
            padded = rows + (-rows) % _tile(first)
            out = {name: t.new_empty((*t.shape[:dim], (rows if dim else padded) // per, *t.shape[dim + 1:]))
                   for name, (t, dim, per) in grown.items()}
        for name, (t, dim, per) in grown.items():
            if name == "scale_zero" and t.shape[-1] != out[name].shape[-1]:  # scales alone beside pairs
                t, out[name] = (t, torch.cat([out[name], out[name] * 8], -1)) if t.shape[-1] == 2 else \
                    (torch.cat([t, t * 8], -1), out[name])
            out[name].narrow(dim, (start - bounds[0][0]) // per, t.shape[dim]).copy_(t)
    split = first if isinstance(first, Int4Weight) else first.split
    nibbles = Int4Weight(None, out["scale_zero"], split.group_size, out["kernel"])
    return nibbles if isinstance(first, Int4Weight) else Int8Weight(nibbles, out.get("fifth"), high=out.get("high"))


def keeps_blocks(reader, dtype: torch.dtype) -> bool:
    """Whether `reader`'s quantized matrices are computed in place in `dtype` (a GGUF, 16-bit)."""
    return dtype in KERNEL_DTYPES and hasattr(reader, "read_int4") and hasattr(reader, "read_int8")


def in_place_specs(reader, specs: list[WeightSpec], dtype: torch.dtype) -> dict[str, WeightSpec]:
    """{stored name: the file tensor's spec} of every matrix kept as blocks (`gguf_codes.coded_specs`:
    a layer matrix in 4- or 8-bit blocks, a head in 8-bit ones, a tied head its table's blocks under
    TIED_HEAD); {} where nothing is (`keeps_blocks`)."""
    if not keeps_blocks(reader, dtype):
        return {}
    return coded_specs(specs, reader.in_place_type)


def in_place_form(reader, spec: WeightSpec, dtype: torch.dtype,
                  piece: tuple[int, int] | None = None) -> Int4Weight | Int8Weight | None:
    """The file's blocks of `spec` as the engine multiplies them (a 4-bit matrix keeps the kernel's
    layout alone where it is known: `Int4Weight.kernel_only`), or None for other tensor types;
    `piece` (start, stop): those rows alone, as the whole's `rows(start, stop)` (a table's piece)."""
    w = reader.read_int4(spec, dtype, piece)
    if w is not None:
        return w.kernel_only()
    return reader.read_int8(spec, dtype, piece)


@dataclasses.dataclass(frozen=True, slots=True)
class CodedMatrix:
    """A matrix of a GGUF's blocks as `in_place_form` will keep it, described, never built (the
    dry run and the planner size a 1B's tied head, 128256 x 2048, without 1.2 GB of samples): its
    class, its bytes (`coded_nbytes`, the formula `flexlamps plan` prices by), its parts' names."""

    type_name: str
    shape: tuple[int, int]
    forms: CodeForms
    dtype: torch.dtype

    @property
    def cls(self) -> type:
        return Int4Weight if is_int4_block_type(self.type_name) else Int8Weight

    @property
    def k_scales(self) -> bool:
        """A 4-bit matrix holding Q4_K's scales as the file has them (`int4_matrix`)."""
        return self.type_name == "Q4_K" and self.forms.native

    @property
    def nbytes(self) -> int:
        return coded_nbytes(self.type_name, self.shape, self.forms)

    def rows(self, start: int, stop: int) -> "CodedMatrix":
        """Output rows start:stop (a table's piece, cut on whole kernel tiles)."""
        return dataclasses.replace(self, shape=(stop - start, self.shape[1]))

    def part_names(self, prefix: str) -> list[str]:
        """The names its stored parts take (`offload.store.stored_parts`): its `form_tile`'s, the
        form's parts being the same at any row count."""
        return [prefix + name for name in _part_names(self.type_name, self.shape[1], self.dtype, self.forms)]

    def form_tile(self) -> Int4Weight | Int8Weight:
        """One kernel tile of rows in the form described, of zero blocks (cached: do not change it):
        what a rule that reads a matrix's form asks of (its kernels, its dense twin), the form being
        the same at any row count."""
        return _form_tile(self.type_name, self.shape[1], self.dtype, self.forms)


@functools.lru_cache(maxsize=64)
def _form_tile(type_name: str, cols: int, dtype: torch.dtype, forms: CodeForms) -> Int4Weight | Int8Weight:
    return _sample(type_name, (KERNEL_TILE, cols), dtype, forms.five_bit, forms.native, forms.native)


@functools.lru_cache(maxsize=64)
def _part_names(type_name: str, cols: int, dtype: torch.dtype, forms: CodeForms) -> tuple[str, ...]:
    return tuple(_form_tile(type_name, cols, dtype, forms).to_tensors("", with_kernel=True))


def coded_matrix(reader, spec: WeightSpec, dtype: torch.dtype) -> CodedMatrix:
    """`spec`'s blocks as this machine keeps them (`in_place_form`), described."""
    shape = tuple(spec.shape)
    five_bit = _five_bit_for(shape[1]) and shape[0] % KERNEL_TILE == 0  # whole tiles, else 6-bit (`coded_nbytes`)
    forms = CodeForms(native=packs_six_bit(), five_bit=five_bit, dtype_bytes=dtype.itemsize)
    return CodedMatrix(reader.in_place_type(spec), shape, forms, dtype)


def _sample(type_name: str, shape: tuple[int, int], dtype: torch.dtype, five_bit: bool, six_bit: bool,
            q6_k_scales: bool = False):
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    raw = np.zeros(quant_shape_to_byte_shape(shape, gguf.GGMLQuantizationType[type_name]), dtype=np.uint8)
    if is_int4_block_type(type_name):  # (kernel_only: a part `_stacked` stacks)
        return int4_matrix(raw, type_name, shape, dtype).kernel_only()
    if type_name == "Q6_K" and six_bit and q6_k_scales:  # (lowest codes: the 6-bit form's fit)
        codes, d, sc = q6_k_parts(raw, shape)
        return Int8Weight.from_k6_blocks(torch.full_like(codes, -32), d, sc, dtype)
    codes, scale, zero = int8_blocks(raw, shape, type_name)
    codes = torch.full_like(codes, _LOWEST_CODE.get(type_name, -16))
    if zero is not None:  # a zero point of its own (Q5_1, Q5_K): held as (scale, zero) pairs, as a file's are
        zero = torch.ones_like(zero)  # (zero blocks' zeros, 8 times their scales, would take the scales alone)
    return Int8Weight.from_codes(codes, scale, shape[1] // scale.shape[1], dtype, zero=zero, five_bit=five_bit,
                                 six_bit=six_bit)
