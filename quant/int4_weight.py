"""Int4Weight: a 4-bit linear weight multiplied in place by torch's fused int4 kernels.

Layout: a weight (N out, K in) is cut into groups of `group_size` consecutive input channels;
each group has a scale and a zero point and `w = (q - 8) * scale + zero` for codes q in [0, 15].
That is torch's weight-only int4 format (`aten._weight_int4pack_mm_for_cpu`, and
`aten._weight_int4pack_mm` on CUDA), and the blocks of GGUF's Q4_0 (`d * (q - 8)`: zero 0)
and Q4_1 (`d * q + m` = `(q - 8) * d + (m + 8 d)`) map onto it exactly, codes untouched.

Two forms of the codes are kept: `codes`, a plain row-major packing (for `dequantize`, for
moving between devices and for files), and `kernel_codes`, the opaque tile layout the fused
kernel reads on this device. On CUDA, and on a CPU whose kernel layout `quant.int4_tiles`
knows, a weight may hold the kernel layout alone (`kernel_only`, half the bytes: what the
offload engine keeps on its tiers, and every weight moved to a CUDA device) and is dequantized
from it, to the same values (on CUDA the codes are read back through the kernel itself). The fused kernel wins for a few rows (decode: it reads 4.5 bits
per weight instead of 16); for many rows (prefill) a dense GEMM on the dequantized matrix is
faster, so callers pick by row count (`flexlamps.models.blocks.linear`). Imports torch only.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import torch

from quant.compressed_weight import CompressedWeight
from quant.int4_layout import K_GROUPS, K_PLANES, K_SUPER
from quant.int4_tiles import tile_rows, tiles_from_unpacked, unpack_tile_rows_into, unpacked_from_tiles

KERNEL_DTYPES = (torch.bfloat16, torch.float16)  # the fused kernels' activation dtypes (CPU)
# torch's CUDA kernel (tinygemm, aten/src/ATen/native/cuda/int4mm.cu) takes bf16 activations
# only and is built for compute capability 8.0 and later (Ampere on; not a T4's 7.5)
CUDA_KERNEL_DTYPES = (torch.bfloat16,)
CUDA_KERNEL_MIN_CAPABILITY = (8, 0)
GROUP_SIZES = (32, 64, 128, 256)
_DEQUANT_CHUNK_BYTES = 2 << 20  # fp32 codes dequantized at a time on a CPU: about one L2 cache


def can_pack(shape: tuple[int, ...], group_size: int, device: torch.device | str = "cpu") -> bool:
    """Whether torch's int4 kernel takes a weight of `shape` (N, K) grouped by `group_size`."""
    if len(shape) != 2 or group_size not in GROUP_SIZES:
        return False
    rows, cols = shape
    if torch.device(device).type == "cuda":
        # a dry run for a GPU this machine lacks assumes a capable one (the planner says which)
        capable = not torch.cuda.is_available() or torch.cuda.get_device_capability(device) >= CUDA_KERNEL_MIN_CAPABILITY
        return rows % 8 == 0 and cols % max(group_size, 32) == 0 and capable
    return rows % 16 == 0 and cols % group_size == 0 and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def kernel_dtypes(device_type: str) -> tuple[torch.dtype, ...]:
    """The activation dtypes the fused kernel multiplies in on a device type."""
    return CUDA_KERNEL_DTYPES if device_type == "cuda" else KERNEL_DTYPES


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) uint8 codes in [0, 15] -> (N, K/2) uint8: byte j of a row holds column j in its
    low nibble and column j + K/2 in its high nibble (two contiguous ops to undo)."""
    half = codes.shape[1] // 2
    return codes[:, :half] | (codes[:, half:] << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_codes`: (N, K/2) uint8 -> (N, K) uint8."""
    return torch.cat([packed & 15, packed >> 4], dim=1)


def _kernel_codes(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) uint8 codes -> the layout the device's fused kernel reads."""
    if codes.device.type == "cuda":
        # NOTE(speed): CUDA's packer takes neighbours (2j, 2j+1) in one byte, high nibble first.
        pairs = (codes[:, ::2] << 4) | codes[:, 1::2]
        inner_k_tiles = 8 if codes.shape[1] % 256 == 0 else 4 if codes.shape[1] % 128 == 0 else 2
        return torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), inner_k_tiles)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)


def _kernel_layout(codes: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """(N, K) uint8 codes in the layout a kernel on their device reads, or None where none takes
    them: torch's packer where it takes the shape (`can_pack`). Else, on a CPU whose tiles
    `quant.int4_tiles` knows, the tiles written here, rows that do not fill the last tile padded
    with code-0 rows to it (a few KB): only our kernels (flexlamps.kernels.tile_gemv) read those,
    computing the tile whole and keeping its real rows; torch's kernel does not (`can_run_fused`)."""
    rows, cols = codes.shape
    tile = tile_rows(cols) if codes.device.type == "cpu" and cols % group_size == 0 else None
    if tile is not None and (rows % tile or not can_pack((rows, cols), group_size, codes.device)):
        return tiles_from_unpacked(torch.cat([codes, codes.new_zeros(-rows % tile, cols)]), tile)
    return _kernel_codes(codes) if can_pack((rows, cols), group_size, codes.device) else None


@functools.lru_cache(maxsize=None)
def _cpu_kernel_blocks_stack() -> bool:
    """Whether the CPU kernel layout of rows stacked in blocks of 64 is the stack of their layouts
    (torch 2.13 tiles 64 output rows at a time); checked once on two random blocks."""
    codes = torch.randint(0, 16, (128, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return torch.equal(_kernel_codes(codes), torch.cat([_kernel_codes(codes[:64]), _kernel_codes(codes[64:])]))


def _kernel_rows_stack(device: torch.device, rows: list[int]) -> bool:
    if device.type == "cuda":  # tinygemm's layout tiles 8 output rows at a time
        return all(r % 8 == 0 for r in rows)
    return device.type == "cpu" and all(r % 64 == 0 for r in rows) and _cpu_kernel_blocks_stack()


def _cuda_kernel_shape(kernel: torch.Tensor) -> tuple[int, int]:
    """(N, K) of a weight in tinygemm's layout: (N/8, K/(inner_k_tiles*16), 32, inner_k_tiles/2) int32."""
    return kernel.shape[0] * 8, kernel.shape[1] * kernel.shape[3] * 32


def _cuda_codes(kernel: torch.Tensor, group_size: int) -> torch.Tensor:
    """The (N, K) uint8 codes of a tinygemm layout, exactly: the kernel itself multiplies an
    identity by the weight with scale 1 and zero point 8 (code q -> q, exact in bf16), a slice
    of K at a time (the layout's dim 1 cuts K into tiles; a whole-K identity would cost K*K*N)."""
    rows, cols = _cuda_kernel_shape(kernel)
    tile = kernel.shape[3] * 32  # input channels per index of dim 1
    step = max(1, max(256, group_size) // tile)
    out = torch.empty(rows, cols, dtype=torch.uint8, device=kernel.device)
    for first in range(0, kernel.shape[1], step):
        start, stop = first * tile, min(cols, (first + step) * tile)
        groups = (stop - start) // group_size
        unit = torch.tensor([1.0, 8.0], dtype=torch.bfloat16, device=kernel.device).expand(groups, rows, 2)
        eye = torch.eye(stop - start, dtype=torch.bfloat16, device=kernel.device)
        part = torch.ops.aten._weight_int4pack_mm(eye, kernel[:, first:first + step].contiguous(), group_size,
                                                  unit.contiguous())
        out[:, start:stop] = part.t().round().to(torch.uint8)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Int4Weight(CompressedWeight):
    """A weight (N, K) as 4-bit codes with a scale and zero point per group of input channels.

    Attributes:
        codes: (N, K/2) uint8 in `pack_codes`' layout; None when only `kernel_codes` are held
            (`kernel_only`).
        scale_zero: (K/group_size, N, 2): each group's scale and zero point (the value of code
            8), in the compute dtype; the fused kernel's own format. Or Q4_K's scales as the file
            holds them (`k_scales`, `from_k_blocks`): (K/256 * K_PLANES, N, 1) 16-bit planes, a
            super-block's fp16 d, dmin and each group's 6-bit `sc | m << 8`, their bits viewed as
            the compute dtype; 4.625 bits a weight with the codes where the pairs make 5.
        group_size: input channels per group.
        kernel_codes: the codes in the fused kernel's layout on `codes`' device (built by
            `from_codes`/`to`); None where the kernel cannot run (then `matmul` dequantizes).
        x_bits: the bits the decode kernel rounds x to for this matrix (None: the kernel's own,
            `flexlamps.kernels.tile_gemv.X_BITS`); an output head keeps 16 (`as_logits_head`).
    """

    KIND: ClassVar[str] = "int4"
    PARTS: ClassVar[tuple[str, ...]] = ("scale_zero", "codes", "kernel_codes")
    codes: torch.Tensor | None
    scale_zero: torch.Tensor
    group_size: int
    kernel_codes: torch.Tensor | None = None
    x_bits: int | None = None

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int,
                   dtype: torch.dtype = torch.bfloat16) -> "Int4Weight":
        """From unpacked codes (N, K) uint8 in [0, 15] and per-group scale and zero (N, K/group_size),
        where `w = (q - 8) * scale + zero`. Scales and zeros are rounded once to `dtype`."""
        rows, cols = codes.shape
        if cols % group_size or scale.shape != (rows, cols // group_size) or zero.shape != scale.shape:
            raise ValueError(f"Int4Weight: codes {tuple(codes.shape)} with group {group_size} need scale and zero "
                             f"of shape {(rows, cols // group_size)}, got {tuple(scale.shape)}, {tuple(zero.shape)}")
        if cols % 2:
            raise ValueError(f"Int4Weight: the input dim {cols} must be even")
        codes = codes.to(torch.uint8).contiguous()
        scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()  # (K/g, N, 2)
        return cls(pack_codes(codes), scale_zero, group_size, _kernel_layout(codes, group_size))

    @classmethod
    def from_k_blocks(cls, codes: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor,
                      m: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> "Int4Weight":
        """Q4_K's `w = d sc q - dmin m` as the file holds it: codes (N, K) in [0, 15], d and dmin
        (N, K/256) (fp16 values), sc and m (N, K/32) 6-bit integers. Only our kernel multiplies it
        (`flexlamps.kernels.tile_gemv`, exact fp32 scales); elsewhere `pairs` gives torch's form."""
        rows, cols = codes.shape
        supers = cols // K_SUPER
        if cols % K_SUPER or d.shape != (rows, supers) or sc.shape != (rows, supers * K_GROUPS):
            raise ValueError(f"Int4Weight.from_k_blocks: codes {tuple(codes.shape)} need d (N, K/256) and sc (N, K/32)")
        halves = [t.to(torch.float16).view(torch.int16) for t in (d, dmin)]  # (N, K/256) each, their bits
        sc_m = (sc.to(torch.int32) | (m.to(torch.int32) << 8)).to(torch.int16).view(rows, supers, K_GROUPS)
        planes = torch.cat([halves[0][..., None], halves[1][..., None], sc_m], dim=-1)  # (N, K/256, K_PLANES)
        scale_zero = planes.reshape(rows, supers * K_PLANES).t().contiguous().view(dtype)[..., None]
        codes = codes.to(torch.uint8).contiguous()
        return cls(pack_codes(codes), scale_zero, 32, _kernel_layout(codes, 32))

    @property
    def k_scales(self) -> bool:
        """Whether it holds Q4_K's scales as the file does (`from_k_blocks`), not (scale, zero) pairs."""
        sz = self.scale_zero
        return sz.shape[-1] == 1 and self.group_size == 32 and sz.shape[0] * K_SUPER == self.shape[1] * K_PLANES

    def scales_offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's scale and the value of code 0, (N, K/g) fp32: from the pairs, or Q4_K's
        `d sc` and `-dmin m`, exact (as our kernel makes them and llama.cpp dequantizes)."""
        if not self.k_scales:
            scale = self.scale_zero[..., 0].t().float()
            return scale, self.scale_zero[..., 1].t().float() - 8 * scale
        rows = self.scale_zero.shape[1]
        planes = self.scale_zero[..., 0].view(torch.int16).t().reshape(rows, -1, K_PLANES)  # (N, K/256, K_PLANES)
        d, dmin = (planes[..., i:i + 1].contiguous().view(torch.float16).float() for i in (0, 1))
        sc_m = planes[..., 2:].int() & 0xFFFF
        scale, offset = d * (sc_m & 0xFF).float(), -(dmin * (sc_m >> 8).float())
        return scale.reshape(rows, -1), offset.reshape(rows, -1)

    def pairs(self) -> "Int4Weight":
        """The same weight with (scale, zero) pairs in its dtype (torch's kernels' form; itself where it holds them)."""
        if not self.k_scales:
            return self
        scale, offset = self.scales_offsets()
        scale_zero = torch.stack([scale.t(), (offset + 8 * scale).t()], dim=-1).to(self.dtype).contiguous()
        return dataclasses.replace(self, scale_zero=scale_zero)

    @classmethod
    def quantize(cls, weight: torch.Tensor, group_size: int = 32, dtype: torch.dtype | None = None) -> "Int4Weight":
        """Min-max asymmetric 4-bit quantization of a dense (N, K) weight, groups along K."""
        rows, cols = weight.shape
        groups = weight.float().reshape(rows, cols // group_size, group_size)  # (N, K/g, g)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
        codes = ((groups - low[..., None]) / scale[..., None]).round_().clamp_(0, 15).to(torch.uint8)
        return cls.from_codes(codes.reshape(rows, cols), scale, low + 8 * scale, group_size,
                              dtype or (weight.dtype if weight.dtype in KERNEL_DTYPES else torch.bfloat16))

    @classmethod
    def cat(cls, weights: list["Int4Weight"]) -> "Int4Weight":
        """The weights stacked along the output dim: one fused kernel call instead of several."""
        first = weights[0]
        if any((w.group_size, w.shape[1], w.dtype, w.device) != (first.group_size, first.shape[1], first.dtype,
                                                                  first.device) for w in weights):
            raise ValueError(f"Int4Weight.cat: weights differ in group size, input dim, dtype or device: {weights}")
        if len({w.k_scales for w in weights}) > 1:  # Q4_K's scales beside pairs: stacked as pairs
            weights = [w.pairs() for w in weights]
        scale_zero = torch.cat([w.scale_zero for w in weights], dim=1)
        kernels = [w.kernel_codes for w in weights]
        stack = all(k is not None for k in kernels) and _kernel_rows_stack(first.device, [w.shape[0] for w in weights])
        if stack and all(w.codes is None for w in weights):  # kernel layouts alone: stacked as they are
            return cls(None, scale_zero, first.group_size, torch.cat(kernels))
        codes = torch.cat([w.plain_codes() for w in weights])
        kernel = torch.cat(kernels) if stack else _kernel_layout(unpack_codes(codes), first.group_size)
        return cls(codes, scale_zero, first.group_size, kernel)

    def kernel_only(self) -> "Int4Weight":
        """The same weight holding only the kernel's layout where it can be read back exactly (on
        CUDA; on a CPU where `quant.int4_tiles` knows the tiles, the last one padded where the rows
        do not fill it), else itself: half the bytes, the same results."""
        if self.codes is None or self.kernel_codes is None:
            return self
        if self.device.type == "cuda":
            return dataclasses.replace(self, codes=None)
        if self.device.type != "cpu":
            return self
        if tile_rows(self.shape[1]) is None:
            return self
        return dataclasses.replace(self, codes=None)

    def rows(self, start: int, stop: int) -> "Int4Weight":
        """Output rows start:stop (a piece of a table): the kernel layout sliced where its tiles
        stack (`_kernel_rows_stack`: whole tiles of 64 on a CPU), else rebuilt from the codes."""
        scale_zero = self.scale_zero[:, start:stop].contiguous()
        kernel = self.kernel_codes
        if (kernel is not None and kernel.dim() == 2 and self.shape[0] % 64 == 0
                and _kernel_rows_stack(self.device, [start, stop - start])):
            codes = None if self.codes is None else self.codes[start:stop].contiguous()
            return Int4Weight(codes, scale_zero, self.group_size, kernel[start:stop].contiguous())
        codes = self.plain_codes()[start:stop].contiguous()
        kernel = _kernel_layout(unpack_codes(codes), self.group_size)
        return Int4Weight(codes, scale_zero, self.group_size, kernel).kernel_only()

    def plain_codes(self) -> torch.Tensor:
        """`codes` (row-major packing), rebuilt from the kernel layout when only that is held."""
        if self.codes is not None:
            return self.codes
        if self.kernel_codes.is_cuda:
            return pack_codes(_cuda_codes(self.kernel_codes, self.group_size))
        rows, cols = self.shape  # the tiles may hold padding rows past them
        return pack_codes(unpacked_from_tiles(self.kernel_codes, cols, tile_rows(cols))[:rows])

    @property
    def shape(self) -> tuple[int, int]:
        if self.codes is None and self.kernel_codes.dim() == 4:  # tinygemm's CUDA layout
            return _cuda_kernel_shape(self.kernel_codes)
        held = self.codes if self.codes is not None else self.kernel_codes  # (N, K/2) on a CPU; tiles padded past N
        return (self.scale_zero.shape[1], 2 * held.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.scale_zero.dtype

    def can_run_fused(self, x: torch.Tensor) -> bool:
        """Whether torch's fused kernel (`matmul`) multiplies x by this weight."""
        # NOTE(offspeed): not in fp32 (an fp32 model's 4-bit weights offloaded): torch's CPU kernel
        # runs it ~5x slower than dequantizing for the dense GEMM (1 vs 80 GFLOP/s in bf16)
        # torch's kernels take groups from 32 (GROUP_SIZES); a Q6_K's 16 runs only on flexlamps.kernels.tile_gemv
        return (self.kernel_codes is not None and not self.k_scales and x.dtype == self.dtype and x.dtype in kernel_dtypes(x.device.type)
                and x.device == self.device and self.group_size in GROUP_SIZES
                and (self.kernel_codes.dim() != 2 or self.kernel_codes.shape[0] == self.scale_zero.shape[1]))
        # (not our tiles padded past the rows: `_kernel_layout`)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) @ w.T with the fused kernel (x in `dtype`, on `device`)."""
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        # NOTE(exact): no `device`/`shape` properties here: a batch-1 decode step makes ~120 calls
        if self.kernel_codes.is_cuda:
            out = torch.ops.aten._weight_int4pack_mm(rows, self.kernel_codes, self.group_size, self.scale_zero)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.kernel_codes, self.group_size, self.scale_zero)
        return out.view(*x.shape[:-1], out.shape[-1])

    def dequantize(self, dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The dense (N, K) weight in `dtype` (default: the scales' dtype), computed in fp32 as
        `q * scale + (zero - 8 * scale)`, from either code layout (the same values); into `out`
        when given (a buffer reused across calls: a fresh one of tens of MiB is paged in anew), or,
        when `out` is a function, handed to it a few rows at a time: `out(start, stop, fp32 rows)`
        (nothing of the matrix's size is made; returns `out`)."""
        if self.codes is None and self.kernel_codes.is_cuda:  # codes read back from tinygemm's layout
            return dataclasses.replace(self, codes=self.plain_codes()).dequantize(dtype, out)
        rows, cols = self.shape
        if out is None:
            out = torch.empty(rows, cols, dtype=dtype or self.dtype, device=self.device)
        scale, offset = self.scales_offsets()  # (N, K/g)
        tile = tile_rows(cols) if self.codes is None else 1
        # NOTE(offspeed): a few rows at a time, so the fp32 codes stay in cache (4-8x faster on
        # a CPU than one pass per op over the whole matrix); in-place mul/add over a broadcast
        # scale is 7x faster than addcmul (speed)
        step = rows if self.device.type != "cpu" else max(64, _DEQUANT_CHUNK_BYTES // (4 * cols) // 64 * 64)
        buf = torch.empty(min(step, rows), cols, device=self.device)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            codes = buf[:stop - start]
            if self.codes is None:
                unpack_tile_rows_into(codes, self.kernel_codes, start, tile)
            elif codes.device.type != "cpu":  # CUDA's bitwise ops write no float output
                codes.copy_(unpack_codes(self.codes[start:stop]))
            else:
                half = cols // 2
                torch.bitwise_and(self.codes[start:stop], 15, out=codes[:, :half])
                torch.bitwise_right_shift(self.codes[start:stop], 4, out=codes[:, half:])
            groups = codes.view(stop - start, cols // self.group_size, self.group_size)
            groups.mul_(scale[start:stop, :, None]).add_(offset[start:stop, :, None])
            if callable(out):  # handed the chunk's fp32 rows
                out(start, stop, codes)
            else:
                out[start:stop].copy_(codes)
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Int4Weight":
        """The same weight on `device`, its kernel layout rebuilt there."""
        device = torch.device(device)
        if device == self.device:
            return self
        if device.type != "cpu" and self.k_scales:  # only our CPU kernel reads Q4_K's scales
            return self.pairs().to(device, non_blocking)
        codes = self.plain_codes().to(device, non_blocking=non_blocking)
        kernel = _kernel_layout(unpack_codes(codes), self.group_size)
        moved = dataclasses.replace(self, codes=codes, scale_zero=self.scale_zero.to(device), kernel_codes=kernel)
        # NOTE(memory): on CUDA the tinygemm layout alone (half the bytes; codes read back from it)
        return moved.kernel_only() if device.type == "cuda" else moved

    def to_tensors(self, prefix: str = "", with_kernel: bool = False) -> dict[str, torch.Tensor]:
        """Flat dict for safetensors. The kernel layout depends on the device and torch build, so
        it is written only on request (`with_kernel`: a cache keyed by those), and alone for a
        `kernel_only` weight then."""
        out = {f"{prefix}int4.scale_zero": self.scale_zero,
               f"{prefix}int4.group_size": torch.tensor([self.group_size], dtype=torch.int32)}
        if self.codes is not None or not with_kernel:
            out[f"{prefix}int4.codes"] = self.plain_codes()
        if with_kernel and self.kernel_codes is not None:
            out[f"{prefix}int4.kernel_codes"] = self.kernel_codes
        return out

    @classmethod
    def part_names(cls, prefix: str = "", codes: bool = True, kernel: bool = False) -> tuple[str, ...]:
        """The names `to_tensors` gives the parts: the group parameters, then the codes in the plain
        layout and / or the kernel's (`codes`, `kernel`: which are written)."""
        parts = ["scale_zero", "group_size"] + ["codes"] * codes + ["kernel_codes"] * kernel
        return tuple(f"{prefix}{cls.KIND}.{part}" for part in parts)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> "Int4Weight":
        """Inverse of `to_tensors`; the kernel layout is taken as stored or rebuilt."""
        codes, scale_zero = tensors.get(f"{prefix}int4.codes"), tensors[f"{prefix}int4.scale_zero"]
        group_size = int(tensors[f"{prefix}int4.group_size"][0])
        kernel = tensors.get(f"{prefix}int4.kernel_codes")
        if codes is None:  # written by a kernel_only weight
            return cls(None, scale_zero, group_size, kernel)
        if kernel is None:
            kernel = _kernel_layout(unpack_codes(codes), group_size)
        return cls(codes, scale_zero, group_size, kernel)

    def __repr__(self) -> str:
        return (f"Int4Weight(shape={self.shape}, group_size={self.group_size}, dtype={self.dtype}, "
                f"fused={self.kernel_codes is not None}, nbytes={self.nbytes}, device={self.device})")

