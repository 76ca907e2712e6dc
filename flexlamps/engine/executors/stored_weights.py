"""How the offload executor keeps each weight on its tiers, and the bytes each form takes.

Compressed 4-bit weights are `quant.int4_weight.Int4Weight`s, the layout the in-memory engine
multiplies in place: 4-bit on every tier, handed to `models.linear` as they are, which runs
torch's fused int4 kernel for few rows (decode) and dequantizes one matrix for a dense GEMM for
many (prefill), as the in-memory engine does with the same weight, so both compute the same
bits. The projections the forward stacks for one kernel call (`DecoderForward.FUSED_INT4`: q/k/v,
gate/up) are stored stacked: a layer needs no copying at run time. On a CPU the tiers hold the
kernel's tile layout alone (`Int4Weight.kernel_only`), used as read; on a GPU the gpu tier holds
tinygemm's layout alone, and the tiers off the device hold the row-major codes, the kernel layout
built on the device after each load.
A matrix the kernel cannot take keeps row-major codes (its kernel layout rebuilt after a load
where the kernel can run it). 8-bit and backend-compressed weights are stored as their
quantizers make them (`quant.QTensor`, dequantized per layer). An FP8 checkpoint's matrices
stay FP8 on every tier (`quant.fp8.Fp8Weight`: codes and tile scales), upcast per call; an
MXFP4 checkpoint's experts stay MXFP4 (`quant.mxfp4.Mxfp4Weight`), dequantized per call.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

import placement
from flexlamps.models.blocks.dense_gemm import pack
from flexlamps.models.loading.checkpoint import keeps_fp8
from flexlamps.models.config import ModelConfig
from flexlamps.models.forward import forward_for
from flexlamps.models.weight_specs import WeightSpec, weight_specs
from offload import tensor_bytes
from quant import engine_weight_config, quantize
from quant.fp8 import FP8, Fp8Weight
from quant.int4_tiles import tile_rows
from quant.int4_layout import int4_params_nbytes
from quant.int4_weight import KERNEL_DTYPES, Int4Weight, can_pack

INT4_GROUP = 32  # input channels per scale and zero point: GGUF's Q4 block, read without a detour
# part of an offload folder's fingerprint: a folder written in another form is rebuilt, never read
INT4_FORMAT = "int4-v1"


# the group-wise weight compression backends (`--weight-quant`) and their bits
GROUPWISE_BACKENDS = {"groupwise4": 4, "groupwise8": 8}


def weight_bits(policy: placement.Policy, weight_quant: str | None = None) -> int:
    """Bits of the group-wise compressed weights: the backend's own, else the policy's."""
    return GROUPWISE_BACKENDS.get(weight_quant or "", policy.compression.num_bits)


def int4_weights(policy: placement.Policy, weight_quant: str | None = None) -> bool:
    """Whether compressed weights are 4-bit `Int4Weight`s, the engine's form for 4-bit
    group-wise compression (bitsandbytes' nf4/fp4 keep their own)."""
    return (policy.compress_weight and weight_bits(policy, weight_quant) == 4
            and weight_quant in (None, "none", "groupwise4"))


def weight_quant_config(num_bits: int = 4):
    """Weights as the engine stores them compressed (one definition: quant.engine_weight_config)."""
    return engine_weight_config(num_bits)


@functools.lru_cache(maxsize=4096)
def stored_nbytes(shape: tuple[int, ...], dtype: torch.dtype, num_bits: int | None, prepacked: bool) -> int:
    """Bytes of one weight as the executor stores it: quantized (`num_bits`), prepacked for the
    GEMM on the gpu tier, or as read (sized on torch's meta device: no memory)."""
    w = torch.empty(shape, dtype=dtype, device="meta")
    if num_bits is not None:
        return tensor_bytes(*quantize(w, weight_quant_config(num_bits)).to_tensors().values())
    return tensor_bytes(pack(w) if prepacked else w)


@functools.lru_cache(maxsize=4096)
def fp8_nbytes(shape: tuple[int, int], block: tuple[int, int], dtype: torch.dtype) -> int:
    """Bytes of an FP8 checkpoint's matrix as the executor stores it (`Fp8Weight.to_tensors`)."""
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    w = Fp8Weight(torch.empty(shape, dtype=FP8, device="meta"), torch.empty(grid, device="meta"), block, dtype)
    return tensor_bytes(*w.to_tensors().values())


def int4_format_tag(device: torch.device) -> str:
    """What the stored 4-bit bytes depend on: this format, and on a CPU the torch build's tiles."""
    if device.type != "cpu":
        return f"{INT4_FORMAT}|codes"
    return (f"{INT4_FORMAT}|tiles {tile_rows(INT4_GROUP * 64)}|torch {torch.__version__}|"
            f"{torch.backends.cpu.get_cpu_capability()}")


def _held_layouts(shape: tuple[int, int], tier: str, device_type: str) -> tuple[bool, bool]:
    """(row-major codes held, kernel layout held) by a 4-bit weight of `shape` on `tier`."""
    kernel = can_pack(shape, INT4_GROUP, device_type)
    if kernel and tier == "gpu" and device_type == "cuda":
        return False, True  # tinygemm's layout alone (`Int4Weight.to` a CUDA device)
    if device_type == "cpu":
        tile = tile_rows(shape[1])
        if kernel and tile is not None and shape[0] % tile == 0:
            return False, True  # the tiles alone, on every tier
    return True, kernel and tier == "gpu"  # off the gpu tier: codes; the kernel layout built after a load


def _fusable(spec: WeightSpec) -> bool:
    return spec.role == "linear" and len(spec.shape) == 2 and spec.shape[1] % INT4_GROUP == 0


class StoredWeights:
    """The weights as the executor stores them: `specs` (with 4-bit q/k/v and gate/up stacked
    when `int4`), the parts each stacked one is read from, and each one's bytes on a tier.
    `fp8_block`: an FP8 checkpoint's tile (None: a dense one); `stores_fp8(spec)`: whether it
    holds a weight in FP8 (default: every matrix `keeps_fp8` names but the routers, as DeepSeek
    ships them); `mxfp4`, `stores_mxfp4(spec)`: the same for an MXFP4 checkpoint (gpt-oss)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device_type: str, int4: bool,
                 fp8_block: tuple[int, int] | None = None, stores_fp8=None, mxfp4: bool = False, stores_mxfp4=None):
        self.dtype, self.device_type, self.int4 = dtype, device_type, int4
        self.fp8_block, self._stores_fp8 = fp8_block, stores_fp8
        self.mxfp4, self._stores_mxfp4 = mxfp4, stores_mxfp4
        self.dtype_bytes = torch.empty((), dtype=dtype).element_size()
        self.parts: dict[str, list[WeightSpec]] = {}  # stacked name -> its parts, in order
        self.specs = self._stacked(weight_specs(cfg), getattr(forward_for(cfg), "FUSED_INT4", {}) if int4 else {})

    def _stacked(self, specs: list[WeightSpec], fused: dict) -> list[WeightSpec]:
        by_name = {s.name: s for s in specs}
        replace: dict[str, WeightSpec | None] = {}  # a part's name -> its stacked spec (first part) or None
        for layer in sorted({s.layer for s in specs if s.layer is not None}):
            for name, locals_ in fused.items():
                parts = [by_name.get(f"layers.{layer}.{p}") for p in locals_]
                biases = [by_name.get(f"layers.{layer}.{p.replace('_proj', '_bias')}") for p in locals_]
                if not all(p is not None and _fusable(p) for p in parts) or len({p.shape[1] for p in parts}) != 1:
                    continue
                if len({b is None for b in biases}) != 1:  # some parts with a bias: the forward keeps them apart
                    continue
                groups = [(name, parts)] + ([(name.replace("_proj", "_bias"), biases)] if biases[0] else [])
                for stacked_local, members in groups:
                    rows = sum(m.shape[0] for m in members)
                    stacked = WeightSpec(f"layers.{layer}.{stacked_local}", (rows, *members[0].shape[1:]),
                                         members[0].role, layer)
                    self.parts[stacked.name] = members
                    replace.update({m.name: None for m in members})
                    replace[members[0].name] = stacked
        return [replace.get(s.name, s) for s in specs if replace.get(s.name, s) is not None]

    def is_int4(self, spec: WeightSpec) -> bool:
        return self.int4 and _fusable(spec)

    def is_fp8(self, spec: WeightSpec) -> bool:
        """Kept as the FP8 checkpoint stores it (when not compressed)."""
        if self._stores_fp8 is None:  # as DeepSeek ships them: its router matrices are bf16
            return self.fp8_block is not None and keeps_fp8(spec) and spec.role != "router"
        return self.fp8_block is not None and keeps_fp8(spec) and self._stores_fp8(spec)

    def is_mxfp4(self, spec: WeightSpec) -> bool:
        """Kept as an MXFP4 checkpoint stores it (when not compressed); default: the experts'
        matrices, as gpt-oss ships them."""
        if not self.mxfp4 or spec.role != "linear" or spec.layer is None:
            return False
        if self._stores_mxfp4 is None:
            return spec.local_name.startswith("experts.")
        return self._stores_mxfp4(spec)

    # -- bytes ------------------------------------------------------------------------------
    def int4_nbytes(self, spec: WeightSpec, tier: str, in_place: dict | None = None) -> int:
        """Bytes of a 4-bit weight on `tier`: its code layouts, its group parameters in the form
        it is read in (`holds_k_scales`: Q4_K's, else pairs; `quant.int4_layout`), group size."""
        rows, cols = spec.shape
        codes, kernel = _held_layouts((rows, cols), tier, self.device_type)
        params = int4_params_nbytes(rows, cols, k_scales=self.holds_k_scales(spec, tier, in_place or {}),
                                    group_size=INT4_GROUP, dtype_bytes=self.dtype_bytes)
        return (codes + kernel) * rows * cols // 2 + params + 4

    def holds_k_scales(self, spec: WeightSpec, tier: str, in_place: dict) -> bool:
        """Whether a 4-bit weight is held on `tier` with Q4_K's scales as the file has them
        (`read_int4`): every part read so (`in_place`: the file's blocks as kept, `in_place_coded`;
        a part quantized here, or stacked beside pairs, makes pairs), and not moved to a device
        for its kernel there (`Int4Weight.to`: pairs on a GPU)."""
        kept = [in_place.get(p.name) for p in self.parts.get(spec.name, [spec])]
        if not all(w is not None and w.cls is Int4Weight and w.k_scales for w in kept):
            return False
        return self.device_type == "cpu" or not _held_layouts(tuple(spec.shape), tier, self.device_type)[1]

    def int4_part_names(self, spec: WeightSpec, tier: str) -> list[str]:
        """The names of a 4-bit weight's parts in the store (`Int4Weight.to_tensors`)."""
        codes, kernel = _held_layouts(tuple(spec.shape), tier, self.device_type)
        return list(Int4Weight.part_names(f"{spec.name}::", bool(codes), bool(kernel)))

    def dense_on_call(self, spec: WeightSpec) -> bool:
        """Whether `models.linear` dequantizes this 4-bit weight whatever the rows (no kernel)."""
        return not can_pack(tuple(spec.shape), INT4_GROUP, self.device_type)

    # -- reading ----------------------------------------------------------------------------
    def read_int4(self, reader, spec: WeightSpec, tier: str, device: torch.device) -> Int4Weight:
        """A 4-bit weight as the executor keeps it on `tier` (parts read and stacked)."""
        w = Int4Weight.cat([self._read_part(reader, p) for p in self.parts.get(spec.name, [spec])])
        codes, kernel = _held_layouts(tuple(spec.shape), tier, self.device_type)
        if device.type != "cpu" and kernel:
            return w.to(device)
        if not codes:
            return w.kernel_only()
        return dataclasses.replace(w, codes=w.plain_codes(), kernel_codes=w.kernel_codes if kernel else None)

    def _read_part(self, reader, spec: WeightSpec) -> Int4Weight:
        """A GGUF's Q4 blocks as they are in the file; other weights quantized (groups of 32)."""
        if self.dtype in KERNEL_DTYPES and hasattr(reader, "read_int4"):
            w = reader.read_int4(spec, self.dtype)
            if w is not None and w.group_size == INT4_GROUP:
                return w
        return Int4Weight.quantize(reader.read(spec, self.dtype), INT4_GROUP, self.dtype)

    def read_dense(self, reader, spec: WeightSpec) -> torch.Tensor:
        """An uncompressed weight (a stacked bias: its parts concatenated)."""
        parts = self.parts.get(spec.name)
        if parts is None:
            return reader.read(spec, self.dtype)
        return torch.cat([reader.read(p, self.dtype) for p in parts])
