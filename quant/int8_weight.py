"""Int8Weight: a weight of 8-bit codes with one scale per group of input channels, `w = d * q`
(GGUF's Q8_0: q in [-128, 127], an fp16 d per 32 inputs), multiplied in place by torch's fused
int4 kernel.

torch has no weight-only int8 kernel with group scales: `_weight_int8pack_mm` takes one scale per
output channel, so Q8_0 would have to be requantized (lossy), and looping it over the groups runs
5-80x slower than a dense GEMM. But an 8-bit code splits exactly into two 4-bit ones: with
q + 128 = 16 h + l (h, l in [0, 15]),

    d q = (h - 8) * 16 d  +  ((l - 8) * d + 8 d),

two groups in the int4 kernel's format `(code - 8) * scale + zero` (`quant.int4_weight`). The h
groups and the l groups side by side make one (N, 2K) 4-bit weight, and [x, x] times it is
x @ (d q).T in one fused call, accumulated in fp32 and rounded once. It holds 1.25 bytes per
weight (the kernel's codes and a scale and zero per 32) where a bf16 copy holds 2, and reads
that much per call: decode of one or two rows, which streams weights from memory, runs
1.3-2x faster than the dense GEMM; from about four rows the dense GEMM wins (`models.linear`
switches). The values are `round(d) * q` exactly, with d rounded once to the compute dtype; a
bf16 copy holds `round(d * q)` instead (the same relative error, at most 2^-8). A zero point per
group (GGUF's Q5_1 / Q5_K: `d q + m`) rides on the low halves' zeros: `8 d + m`.

The 5-bit form (`from_codes(..., five_bit=True)`, codes in [-16, 15]: GGUF's Q5_0 / Q5_1 / Q5_K)
holds u = q + 16 as 0.625 bytes a weight instead: its low nibbles as a 4-bit weight in the CPU
kernel's tiles of 64 rows, its fifth bits as a plane in the order our AVX-512 kernel
(`flexlamps.kernels.tile_gemv`) reads them, and a scale and zero per group, `w = (u - 16) * scale + zero`.
Only that kernel multiplies it in place (torch's int4 kernel takes no fifth bit: elsewhere it is
dequantized for the dense GEMM), and it leaves the CPU as the split. Decode streams these weights
from memory, so a call reads about 0.6 of the split's bytes.

The 6-bit form (`from_codes(..., six_bit=True)`, codes in [-32, 31]: GGUF's Q6_K, and Q5_x where
the 5-bit form is not taken) holds u = q + 32 in 1 byte a weight where the split holds 1.5: its
low nibbles as a 4-bit weight in the CPU kernel's tiles (the split's low halves), the plane of its
high two bits laid out as those tiles (`high_plane`), and only the low halves' (scale, zero)
pairs (the high halves' 16 d and 0 are implied). Our kernel adds 6 to each high part, which makes
it the split's high nibble (u + 96 = q + 128), and runs the split's arithmetic: the same bits.
Where every pair's zero is 8 times its scale in the compute dtype, bit for bit (Q6_K, w = d q: the
zero 8 d rounds as d does, a power of two apart), it holds the scales alone (`scales_alone`: 7 bits
a weight, not 8) and the kernel makes each zero as 8 scale, the value the pair held. Only our
kernel multiplies it in place (any variant); it leaves the CPU as the split.

Q6_K's form (`from_k6_blocks`, `k_scales`) is the 6-bit form holding Q6_K's scales as the file does:
a super-block's fp16 d and its 16 groups' int8 sc as 16-bit planes (17 a 256 inputs: 7.06 bits a
weight with the codes), values d sc q exact in fp32 (llama.cpp's). Our kernel's products with 8-bit
x round x per 256 and sum a super-block's sc q x exactly in int32, one fp32 step a super-block
(flexlamps/kernels/tile_scales_k6.h); every other path (16-bit x: a head; torch; another device;
stacking beside the 6-bit form) takes `pairs`, the 6-bit form's scales. Imports torch only.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from quant.compressed_weight import CompressedWeight
from quant.int4_tiles import tile_rows, tiles_from_unpacked, unpacked_from_tiles
from quant.int4_weight import Int4Weight, unpack_codes

_DEQUANT_CHUNK_BYTES = 2 << 20  # fp32 values dequantized at a time on a CPU: about one L2 cache
_PACK_ROWS = 4096  # rows split and laid out at a time
FIVE_BIT_TILE = 64  # output rows per tile of the 5-bit form (`flexlamps.kernels.tile_gemv.TILE`)
K6_SUPER, K6_GROUP = 256, 16  # Q6_K's super-block and group (sub-block) of inputs
K6_GROUPS = K6_SUPER // K6_GROUP
K6_PLANES = 1 + K6_GROUPS  # Q6_K's form's 16-bit planes a super-block: d, then each group's sc
_PLANE_BLOCK = 64  # tile bytes whose high parts a 32-byte block of the 6-bit form's plane holds


def fifth_plane(bits: torch.Tensor) -> torch.Tensor:
    """(N, K) fifth bits (0 / 1) -> (N/64, 8K) bytes: for tile t and columns k..k+3, four
    little-endian 64-bit words, bit 4i + c of word q the bit of row 64t + 16q + i, column k + c
    (what tile_gemv.c's `tile_codes` adds to the 16 rows of its register q)."""
    rows, cols = bits.shape
    words = bits.reshape(rows // 64, 4, 16, cols // 4, 4).permute(0, 3, 1, 2, 4)  # (t, k/4, q, i, c)
    octets = words.reshape(-1, 8, 8).to(torch.uint8) << torch.arange(8, dtype=torch.uint8, device=bits.device)
    return octets.sum(-1, dtype=torch.uint8).reshape(rows // 64, 8 * cols)


def fifth_bits(plane: torch.Tensor, cols: int) -> torch.Tensor:
    """Inverse of `fifth_plane`: (N/64, 8K) bytes -> (N, K) uint8 bits."""
    tiles = plane.shape[0]
    bits = (plane.reshape(-1, 8, 1) >> torch.arange(8, dtype=torch.uint8, device=plane.device)) & 1
    return bits.reshape(tiles, cols // 4, 4, 16, 4).permute(0, 2, 3, 1, 4).reshape(64 * tiles, cols)


def high_plane(tiles: torch.Tensor) -> torch.Tensor:
    """(N, K/2) tile bytes whose nibbles are in [0, 3] (the codes' high two bits, in the kernel's tile
    layout, N whole tiles) -> the (N, K/4) plane: byte 32b + i holds tile byte 64b + i's nibbles in
    bits 0-1 and 4-5, byte 64b + 32 + i's in bits 2-3 and 6-7 (tile_gemv.c's 6-bit form)."""
    rows, half = tiles.shape
    blocks = tiles.reshape(-1, 2, _PLANE_BLOCK // 2)
    return (blocks[:, 0] | (blocks[:, 1] << 2)).reshape(rows, half // 2)


def plane_tiles(plane: torch.Tensor) -> torch.Tensor:
    """Inverse of `high_plane`: the (N, K/4) plane -> (N, K/2) tile bytes of nibbles in [0, 3]."""
    rows, quarter = plane.shape
    blocks = plane.reshape(-1, 1, _PLANE_BLOCK // 2)
    return torch.cat([blocks & 0x33, (blocks >> 2) & 0x33], dim=1).reshape(rows, 2 * quarter)


def split_codes(codes: torch.Tensor, scale: torch.Tensor,
                zero: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int8 codes (N, K) and per-group scales (N, G) -> the (N, 2K) 4-bit codes, scales and zeros
    whose int4 weight equals `scale * codes (+ zero)` (high nibbles' groups first, then the low
    nibbles', whose zero points carry `zero`)."""
    shifted = codes.to(torch.int16) + 128
    high, low = (shifted >> 4).to(torch.uint8), (shifted & 15).to(torch.uint8)
    return (torch.cat([high, low], dim=1), *_split_scales(scale, zero))


def _low_scales(scale: torch.Tensor, zero: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's low halves' (N, G) scales and zeros: d and 8 d (+ zero)."""
    scale = scale.float()
    return scale, 8 * scale if zero is None else 8 * scale + zero.float()


def _split_scales(scale: torch.Tensor, zero: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The split's (N, 2G) scales and zeros: 16 d and 0 for the high halves, d and 8 d (+ zero)
    for the low ones (`_low_scales`)."""
    scale, low_zero = _low_scales(scale, zero)
    return torch.cat([16 * scale, scale], dim=1), torch.cat([torch.zeros_like(scale), low_zero], dim=1)


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Weight(CompressedWeight):
    """A weight (N, K) as int8 codes with one scale per group of input channels, held as the
    (N, 2K) 4-bit weight `split`, or in the 5-bit form (`fifth` given) as the (N, K) 4-bit weight
    of the codes' low nibbles, whose (scale, zero) mean `(u - 16) * scale + zero`, and the plane
    of their fifth bits, or in the 6-bit form (`high` given) as the (N, K) 4-bit weight of the
    codes' low nibbles with the split's low halves' (scale, zero) and the plane of their high two
    bits (see the module's docstring); `x_bits` as `Int4Weight.x_bits`."""

    KIND: ClassVar[str] = "int8"
    PARTS: ClassVar[tuple[str, ...]] = ("split", "fifth", "high")
    split: Int4Weight
    fifth: torch.Tensor | None = None
    x_bits: int | None = None
    high: torch.Tensor | None = None

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, group_size: int = 32,
                   dtype: torch.dtype = torch.bfloat16, zero: torch.Tensor | None = None,
                   five_bit: bool = False, six_bit: bool = False) -> "Int8Weight":
        """From int8 codes (N, K) and scales (N, K/group_size): `w = scale * codes`, plus `zero`
        (N, K/group_size) when given (GGUF's Q5_1 / Q5_K: `d q + m` with q - 16 as the code).
        `five_bit`: the 5-bit form where the codes fit it (in [-16, 15], on a CPU whose int4
        tiles have 64 rows, whole tiles), for our AVX-512 kernel; `six_bit`: else the 6-bit form
        where they fit it (in [-32, 31], on a CPU whose int4 tiles our kernel takes), for our
        kernel in any variant; else the split."""
        rows, cols = codes.shape
        if (codes.dtype != torch.int8 or cols % group_size or scale.shape != (rows, cols // group_size)
                or (zero is not None and zero.shape != scale.shape)):
            raise ValueError(f"Int8Weight: need int8 codes (N, K) and scales (and zeros) (N, K/{group_size}), got "
                             f"{codes.dtype} {tuple(codes.shape)} and {tuple(scale.shape)}")
        if five_bit and _fits_five_bits(codes):
            return cls._five_bit(codes, scale, group_size, dtype, zero)
        if six_bit and _fits_six_bits(codes):
            return cls._six_bit(codes, scale, group_size, dtype, zero)
        tile = tile_rows(2 * cols) if codes.device.type == "cpu" else None
        if tile is None or rows % tile:
            return cls(Int4Weight.from_codes(*split_codes(codes, scale, zero), group_size, dtype).kernel_only())
        # The kernel's tile layout written a few rows at a time (`int4_tiles`: checked against torch's
        # packer), where the packer would take int32 codes of the whole split (16 bytes a weight).
        kernel = torch.empty(rows, cols, dtype=torch.uint8)
        step = max(tile, _PACK_ROWS // tile * tile)
        for start in range(0, rows, step):
            halves = split_codes(codes[start:start + step], scale[start:start + step])[0]
            kernel[start:start + step] = tiles_from_unpacked(halves, tile)
        scales, zeros = _split_scales(scale, zero)
        scale_zero = torch.stack([scales.t(), zeros.t()], dim=-1)
        return cls(Int4Weight(None, scale_zero.to(dtype).contiguous(), group_size, kernel))

    @classmethod
    def _five_bit(cls, codes: torch.Tensor, scale: torch.Tensor, group_size: int, dtype: torch.dtype,
                  zero: torch.Tensor | None) -> "Int8Weight":
        u = (codes + 16).to(torch.uint8)
        zero = torch.zeros_like(scale) if zero is None else zero
        scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()  # (K/g, N, 2)
        nibbles = Int4Weight(None, scale_zero, group_size, tiles_from_unpacked(u & 15, FIVE_BIT_TILE))
        return cls(nibbles, fifth_plane(u >> 4))

    @classmethod
    def _six_bit(cls, codes: torch.Tensor, scale: torch.Tensor, group_size: int, dtype: torch.dtype,
                 zero: torch.Tensor | None) -> "Int8Weight":
        """The 6-bit form: u = codes + 32's low nibbles and high two bits in tiles (the last one
        padded with code-0 rows where the rows do not fill it), the split's low halves' pairs."""
        rows, cols = codes.shape
        tile = tile_rows(cols)
        padded = -(-rows // tile) * tile
        nibbles = torch.empty(padded, cols // 2, dtype=torch.uint8)
        plane = torch.empty(padded, cols // 4, dtype=torch.uint8)
        step = max(tile, _PACK_ROWS // tile * tile)
        for start in range(0, padded, step):
            u = (codes[start:start + step].to(torch.int16) + 32).to(torch.uint8)
            u = torch.cat([u, u.new_zeros(min(step, padded - start) - len(u), cols)])
            nibbles[start:start + step] = tiles_from_unpacked(u & 15, tile)
            plane[start:start + step] = high_plane(tiles_from_unpacked(u >> 4, tile))
        low_scale, low_zero = _low_scales(scale, zero)
        scale_zero = torch.stack([low_scale.t(), low_zero.t()], dim=-1).to(dtype).contiguous()  # (K/g, N, 2)
        if torch.equal(scale_zero[..., 1], scale_zero[..., 0] * 8):  # no zero point of its own: the scales alone
            scale_zero = scale_zero[..., :1].contiguous()  # (K/g, N, 1)
        return cls(Int4Weight(None, scale_zero, group_size, nibbles), high=plane)

    @classmethod
    def from_k6_blocks(cls, codes: torch.Tensor, d: torch.Tensor, sc: torch.Tensor,
                       dtype: torch.dtype = torch.bfloat16) -> "Int8Weight":
        """Q6_K's `w = d sc q` as the file holds it, in the 6-bit form: codes (N, K) in [-32, 31], d
        (N, K/256) (fp16 values) and sc (N, K/16) int8 sub-scales, held as K6_PLANES 16-bit planes a
        super-block (`k_scales`: d's fp16 bits, then each group's sc) where the 6-bit form holds each
        group's scale d sc rounded to `dtype`. Our kernel's products with 8-bit x sum a super-block's
        sc q x exactly in int32 and scale it once (llama.cpp's Q6_K x Q8_K); `pairs` gives the
        6-bit form's scales. Where the codes do not take the 6-bit form: `from_codes`' form."""
        rows, cols = codes.shape
        supers = cols // K6_SUPER
        if cols % K6_SUPER or d.shape != (rows, supers) or sc.shape != (rows, supers * K6_GROUPS):
            raise ValueError(f"Int8Weight.from_k6_blocks: codes {tuple(codes.shape)} need d (N, K/256) and sc (N, K/16)")
        w = cls.from_codes(codes, d.float().repeat_interleave(K6_GROUPS, 1) * sc.float(), K6_GROUP, dtype, six_bit=True)
        if w.high is None:
            return w
        planes = torch.cat([d.to(torch.float16).view(torch.int16)[..., None],
                            sc.to(torch.int16).view(rows, supers, K6_GROUPS)], dim=-1)  # (N, K/256, K6_PLANES)
        scale_zero = planes.reshape(rows, supers * K6_PLANES).t().contiguous().view(dtype)[..., None]
        return cls(dataclasses.replace(w.split, scale_zero=scale_zero), high=w.high)

    @property
    def k_scales(self) -> bool:
        """Whether it is the 6-bit form holding Q6_K's scales as the file does (`from_k6_blocks`)."""
        sz = self.split.scale_zero
        return (self.high is not None and sz.shape[-1] == 1 and self.group_size == K6_GROUP
                and sz.shape[0] * K6_SUPER == self.shape[1] * K6_PLANES)

    def _k6_scales(self) -> torch.Tensor:
        """Q6_K's form's group scales d sc (N, K/16) in fp32, exact (11 by 8 significant bits)."""
        rows = self.split.scale_zero.shape[1]
        planes = self.split.scale_zero[..., 0].view(torch.int16).t().reshape(rows, -1, K6_PLANES)
        d = planes[..., :1].contiguous().view(torch.float16).float()
        return (d * planes[..., 1:].float()).reshape(rows, -1)

    def pairs(self) -> "Int8Weight":
        """The 6-bit form with each group's scale d sc rounded to its dtype (the scales alone: what
        every path but our 8-bit-x products reads, an output head's too); itself where it holds them."""
        if not self.k_scales:
            return self
        scale_zero = self._k6_scales().t().to(self.dtype).contiguous()[..., None]
        return dataclasses.replace(self, split=dataclasses.replace(self.split, scale_zero=scale_zero))

    def as_split(self) -> "Int8Weight":
        """The same codes, scales and zero points as the split (itself when it is one)."""
        if self.fifth is None and self.high is None:
            return self
        rows, cols = self.shape
        codes = torch.empty(rows, cols, dtype=torch.int8)
        self._codes_into(codes, 0, rows)
        scale, zero = self._scale_zero()
        return Int8Weight.from_codes(codes, scale, self.group_size, self.dtype, zero=zero)

    @classmethod
    def cat(cls, weights: list["Int8Weight"]) -> "Int8Weight":
        """The weights stacked along the output dim (each row keeps its two halves, or its nibble
        and fifth bit; a mix is stacked as splits): one fused call."""
        if all(w.fifth is not None for w in weights):  # whole tiles each: the planes stack as the tiles do
            return cls(Int4Weight.cat([w.split for w in weights]), torch.cat([w.fifth for w in weights]))
        if len({w.k_scales for w in weights}) > 1:  # Q6_K's scales beside others: stacked as their pairs
            weights = [w.pairs() for w in weights]
        if all(w.high is not None and w.shape[0] % tile_rows(w.shape[1]) == 0 for w in weights):  # the same
            first, alone = weights[0].split, all(w.scales_alone for w in weights)
            scale_zero = torch.cat([_pairs(w.split.scale_zero) if w.scales_alone and not alone else w.split.scale_zero
                                    for w in weights], dim=1)
            nibbles = Int4Weight(None, scale_zero, first.group_size, torch.cat([w.split.kernel_codes for w in weights]))
            return cls(nibbles, high=torch.cat([w.high for w in weights]))
        return cls(Int4Weight.cat([w.as_split().split for w in weights]))

    def rows(self, start: int, stop: int) -> "Int8Weight":
        """Output rows start:stop (a piece of a table); the 5-bit form's plane sliced as its tiles
        stack (`cat`: a row of bytes a tile of 64), where they do, else as the split."""
        if self.fifth is not None and start % FIVE_BIT_TILE == 0 and stop % FIVE_BIT_TILE == 0:
            return Int8Weight(self.split.rows(start, stop),
                              self.fifth[start // FIVE_BIT_TILE:stop // FIVE_BIT_TILE].contiguous())
        tile = tile_rows(self.shape[1])
        if self.high is not None and start % tile == 0 and (stop % tile == 0 or stop == self.shape[0]):
            end = -(-stop // tile) * tile  # the last tile's padding rows with it
            s = self.split
            nibbles = Int4Weight(None, s.scale_zero[:, start:stop].contiguous(), s.group_size,
                                 s.kernel_codes[start:end].contiguous())
            return Int8Weight(nibbles, high=self.high[start:end].contiguous())
        return Int8Weight(self.as_split().split.rows(start, stop))

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.split.shape
        return (rows, cols if self.fifth is not None or self.high is not None else cols // 2)

    @property
    def dtype(self) -> torch.dtype:
        return self.split.dtype

    @property
    def scales_alone(self) -> bool:
        """Whether it is the 6-bit form holding its scales alone, (K/g, N, 1): each zero 8 scale."""
        return self.high is not None and self.split.scale_zero.shape[-1] == 1 and not self.k_scales

    @property
    def group_size(self) -> int:
        return self.split.group_size

    def can_run_fused(self, x: torch.Tensor) -> bool:
        """Whether torch's fused int4 kernel (`matmul`) multiplies x by it: the split's question;
        never the 5- or 6-bit form (our kernel's alone)."""
        return self.fifth is None and self.high is None and self.split.can_run_fused(x)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) @ w.T with torch's fused kernel (x in `dtype`, on `device`; `can_run_fused`)."""
        if self.fifth is not None or self.high is not None:
            raise ValueError("Int8Weight.matmul: torch's int4 kernel cannot multiply the 5-bit or 6-bit form; "
                             "flexlamps.kernels.tile_gemv does, or dequantize it")
        return self.split.matmul(torch.cat([x, x], dim=-1))

    def dequantize(self, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The dense (N, K) weight in `dtype` (default: the scales' dtype): `d * q` computed exactly
        in fp32 (plus the zero point, where there is one) and rounded once; into `out` when given,
        or, when `out` is a function, handed to it a few rows at a time: `out(start, stop, fp32 rows)`.
        A few rows at a time: the int8 codes are joined back from the halves' nibbles, then scaled
        by the low halves' scales (d)."""
        rows, cols = self.shape
        if out is None:
            out = torch.empty(rows, cols, dtype=dtype or self.dtype, device=self.device)
        scale, zero = self._scale_zero()
        step = rows if self.device.type != "cpu" else max(64, _DEQUANT_CHUNK_BYTES // (4 * cols) // 64 * 64)
        values = torch.empty(min(step, rows), cols, device=self.device)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            v = values[:stop - start]
            self._codes_into(v, start, stop)  # int8 -> fp32, exact
            groups = v.view(stop - start, -1, self.group_size).mul_(scale[start:stop, :, None])
            if zero is not None:
                groups.add_(zero[start:stop, :, None])
            if callable(out):  # handed the chunk's fp32 rows
                out(start, stop, v)
            else:
                out[start:stop].copy_(v)
        return out

    def _scale_zero(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each group's scale and zero point (N, K/g) in fp32, `w = scale * code + zero`; zero None
        where it is 0 throughout (Q8_0 / Q5_0)."""
        if self.fifth is not None:
            scale, zero = (part.t().float() for part in self.split.scale_zero.unbind(-1))
        elif self.k_scales:
            return self._k6_scales(), None
        else:  # (K/g, N, 2): the low halves' d, 8 d + zero (the 6-bit form holds them alone)
            low = self.split.scale_zero[0 if self.high is not None else self.shape[1] // self.group_size:]
            low = _pairs(low) if self.scales_alone else low
            scale = low[..., 0].t()
            zero = low[..., 1].t().float() - 8 * scale.float()  # exactly 0 for Q8_0 / Q5_0
        return scale, (zero if bool(zero.any()) else None)

    def _codes_into(self, v: torch.Tensor, start: int, stop: int) -> None:
        """The int8 codes of output rows start .. stop, as numbers into `v`. In the kernel's tile
        layout a byte of the high halves' columns holds h of rows j and j + t/2 of a tile, the same
        byte of the low halves' columns their l; 16 h + l is q + 128, which XOR 128 reads as q."""
        s, cols = self.split, self.shape[1]
        if self.fifth is not None:  # u = nibble + 16 fifth; q = u - 16
            nibbles = unpacked_from_tiles(s.kernel_codes[start:stop], cols, FIVE_BIT_TILE)
            tiles = self.fifth[start // FIVE_BIT_TILE:stop // FIVE_BIT_TILE]
            v.copy_(nibbles.add_(fifth_bits(tiles, cols) << 4).view(torch.int8).sub_(16))
            return
        if self.high is not None:  # u = nibble + 16 high; q = u - 32
            tile = tile_rows(cols)
            end = min(-(-stop // tile) * tile, s.kernel_codes.shape[0])  # whole tiles, the padding dropped below
            u = unpacked_from_tiles(s.kernel_codes[start:end], cols, tile)
            u.add_(unpacked_from_tiles(plane_tiles(self.high[start:end]), cols, tile) << 4)
            v.copy_(u[:stop - start].view(torch.int8)).sub_(32)
            return
        if s.codes is not None:
            halves = unpack_codes(s.codes[start:stop])
            v.copy_(((halves[:, :cols] << 4) | halves[:, cols:]).bitwise_xor_(128).view(torch.int8))
            return
        tile = tile_rows(2 * cols)
        if (stop - start) % tile:  # the weight's last tile, padded to the tile: its padding dropped
            whole = torch.empty(-(-(stop - start) // tile) * tile, cols, dtype=v.dtype, device=v.device)
            self._codes_into(whole, start, start + len(whole))
            v.copy_(whole[:stop - start])
            return
        tiles = s.kernel_codes.view(-1, 2 * cols, tile // 2)[start // tile:stop // tile]  # (n, 2K, t/2)
        high, low = tiles[:, :cols], tiles[:, cols:]
        both = torch.empty(len(tiles), 2, cols, tile // 2, dtype=torch.uint8, device=v.device)
        torch.bitwise_left_shift(high, 4, out=both[:, 0])  # rows j of each tile
        both[:, 0].bitwise_or_(low & 15)
        torch.bitwise_and(high, 240, out=both[:, 1])  # rows t/2 + j
        both[:, 1].bitwise_or_(low >> 4)
        both.bitwise_xor_(128)
        v.view(len(tiles), 2, tile // 2, cols).copy_(both.view(torch.int8).transpose(2, 3))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Int8Weight":
        """On `device`; the 5-bit form leaves the CPU as the split (its zero points, where it has
        them, rounded once more: 8 scale + zero)."""
        if torch.device(device) == self.device:
            return self
        return Int8Weight(self.as_split().split.to(device, non_blocking=non_blocking))

    def to_tensors(self, prefix: str = "", with_kernel: bool = False) -> dict[str, torch.Tensor]:
        """Flat dict for safetensors (`Int4Weight.to_tensors` of the split or the nibbles, under
        `<prefix>int8.`; the 5-bit form's plane as `<prefix>int8.fifth`, the 6-bit form's as
        `<prefix>int8.high`)."""
        out = self.split.to_tensors(f"{prefix}int8.", with_kernel)
        if self.fifth is not None:
            out[f"{prefix}int8.fifth"] = self.fifth
        if self.high is not None:
            out[f"{prefix}int8.high"] = self.high
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> "Int8Weight":
        return cls(Int4Weight.from_tensors(tensors, f"{prefix}int8."), tensors.get(f"{prefix}int8.fifth"),
                   high=tensors.get(f"{prefix}int8.high"))

    @classmethod
    def part_names(cls, prefix: str = "", codes: bool = True, kernel: bool = False) -> tuple[str, ...]:
        """The names `to_tensors` gives the split's parts (`Int4Weight.part_names`), not the 5- or 6-bit plane."""
        return Int4Weight.part_names(f"{prefix}{cls.KIND}.", codes, kernel)

    @classmethod
    def is_stored(cls, tensors, prefix: str = "") -> bool:
        return Int4Weight.is_stored(tensors, f"{prefix}int8.")

    def __repr__(self) -> str:
        return (f"Int8Weight(shape={self.shape}, group_size={self.group_size}, dtype={self.dtype}, "
                f"{'5-bit' if self.fifth is not None else '6-bit' if self.high is not None else 'split'}, "
                f"nbytes={self.nbytes}, device={self.device})")


def _pairs(scales: torch.Tensor) -> torch.Tensor:
    """The 6-bit form's scales alone (K/g, N, 1) as the pairs they stand for: (d, 8 d), exact."""
    return torch.cat([scales, scales * 8], dim=-1)


def _fits_five_bits(codes: torch.Tensor) -> bool:
    """Whether codes (N, K) can take the 5-bit form: in [-16, 15], on a CPU whose int4 tiles
    (`tile_rows`) have 64 rows, in whole tiles."""
    rows, cols = codes.shape
    return (codes.device.type == "cpu" and rows % FIVE_BIT_TILE == 0 and cols % 4 == 0
            and tile_rows(cols) == FIVE_BIT_TILE and int(codes.min()) >= -16 and int(codes.max()) <= 15)


def _fits_six_bits(codes: torch.Tensor) -> bool:
    """Whether codes (N, K) can take the 6-bit form: in [-32, 31], on a CPU whose int4 tiles our
    kernel takes (32 or 64 rows), K a multiple of 4 (the plane's blocks then never straddle tiles)."""
    rows, cols = codes.shape
    return (codes.device.type == "cpu" and rows > 0 and cols % 4 == 0 and tile_rows(cols) in (32, 64)
            and int(codes.min()) >= -32 and int(codes.max()) <= 31)
