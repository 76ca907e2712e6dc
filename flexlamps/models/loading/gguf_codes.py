"""A GGUF file's matrices the engine keeps as the file's blocks ("codes": `models.loading.in_place`)
and the bytes each is held in, from the header alone (torch-free): the rule `in_place.in_place_specs`
keeps them by, and what `flexlamps plan` prices a GGUF's matrices at (`gguf_coded_bytes`).

`coded_nbytes` follows the weight kinds' layouts (`quant.int4_weight.Int4Weight`,
`quant.int8_weight.Int8Weight`, each kind's `stored_bytes`): codes in rows padded to whole kernel
tiles (KERNEL_TILE rows), and each form's group parameters in the compute dtype. Which form a type
takes depends on the machine (`CodeForms`: where our kernel runs, Q4_K and Q6_K keep the file's
scales and Q5_x / Q6_K the 6-bit form; AVX-512's kernel takes Q5_x's 5-bit form); the executor's
store and dry run size its matrices by it too (`in_place.CodedMatrix`), and tests/unit/test_plan_gguf.py
holds it to the matrices read from a file on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from flexlamps.models.config import ModelConfig
from flexlamps.models.loading.gguf_hybrid import changed_by_converter, hybrid_layer_names
from flexlamps.models.loading.gguf_moe import MLA_GGUF_LAYER, moe_gguf_tensor
from flexlamps.models.loading.gguf_names import GGUF_GLOBAL, layer_names
from flexlamps.models.weight_specs import WeightSpec, weight_specs
from quant.int4_layout import K_PLANES, K_SUPER, int4_params_nbytes

TIED_HEAD = "lm_head"  # where a tied model's head is kept as its table's blocks
INT4_BLOCK_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # kept as 4-bit `Int4Weight`s
INT8_BLOCK_TYPES = ("Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K")  # as int8 codes; Q5_1 / Q5_K with a zero point
_ZERO_POINTS = ("Q5_1", "Q5_K")
_GROUP = {"Q6_K": 16}  # inputs per scale (else 32)
K6_PLANES = 17  # Q6_K's form's 16-bit planes a super-block of 256 (`quant.int8_weight.K6_PLANES`)
KERNEL_TILE = 64  # rows a tile of the CPU kernel's layout holds (torch's packer's, `quant.int4_tiles.tile_rows`)
LAYOUT_BYTES = 4  # the int32 layout tensor a store keeps beside a weight's parts (`CompressedWeight.to_tensors`)


@dataclass(frozen=True, slots=True)
class CodeForms:
    """How a machine holds a GGUF's blocks (`models.loading.in_place`): `native`, where our kernel
    runs (any variant: Q4_K's and Q6_K's scales as the file has them, Q5_x and Q6_K in the 6-bit
    form; elsewhere (scale, zero) pairs and int8 codes split in two 4-bit halves); `five_bit`: Q5_x
    in the 5-bit form (AVX-512's kernel, for widths its int8 GEMM takes); `dtype_bytes`: the compute
    dtype the scales are held in. The default is the AVX2 baseline's forms in a 16-bit dtype."""

    native: bool = True
    five_bit: bool = False
    dtype_bytes: int = 2


def coded_nbytes(type_name: str, shape: tuple[int, int], forms: CodeForms = CodeForms()) -> int:
    """Bytes a (rows, cols) matrix of GGUF `type_name` blocks takes as the engine holds it."""
    rows, cols = shape
    padded = -(-rows // KERNEL_TILE) * KERNEL_TILE
    pair = 2 * forms.dtype_bytes  # a (scale, zero) pair
    if type_name in INT4_BLOCK_TYPES:
        k_scales = type_name == "Q4_K" and forms.native
        params = int4_params_nbytes(rows, cols, k_scales=k_scales, dtype_bytes=forms.dtype_bytes)
        return padded * cols // 2 + params + LAYOUT_BYTES
    if type_name not in INT8_BLOCK_TYPES:
        raise ValueError(f"coded_nbytes: {type_name} is not a block type the engine keeps as codes")
    groups = rows * (cols // _GROUP.get(type_name, 32))
    if forms.five_bit and type_name in ("Q5_0", "Q5_1", "Q5_K") and rows % KERNEL_TILE == 0:  # in whole tiles
        # nibbles, a plane of fifth bits, pairs (other rows: the 6-bit form, `Int8Weight.from_codes`)
        return padded * cols // 2 + padded * cols // 8 + groups * pair + LAYOUT_BYTES
    if forms.native and type_name != "Q8_0":  # the 6-bit form: nibbles, a plane of high two bits
        if type_name == "Q6_K":  # the file's scales: d and each group's sc, 16-bit planes
            params = rows * (cols // K_SUPER) * K6_PLANES * 2
        else:  # a scale a group, or pairs where the type has a zero point
            params = groups * (pair if type_name in _ZERO_POINTS else forms.dtype_bytes)
        return padded * cols // 2 + padded * cols // 4 + params + LAYOUT_BYTES
    return padded * cols + 2 * groups * pair + LAYOUT_BYTES  # the split: two 4-bit halves, pairs each


def gguf_tensor_name(cfg: ModelConfig, spec: WeightSpec) -> str:
    """The name of the file's tensor `spec` lies in (for an expert: the stacked tensor)."""
    moe = moe_gguf_tensor(spec.local_name, cfg.model_type) if spec.layer is not None else None
    if moe is not None:
        return f"blk.{spec.layer}.{moe[0]}"
    if cfg.hybrid is not None and spec.layer is not None:
        return f"blk.{spec.layer}.{hybrid_layer_names(spec.local_name)[0]}"
    names = MLA_GGUF_LAYER if cfg.mla is not None else layer_names(cfg.model_type)
    return GGUF_GLOBAL[spec.name] if spec.layer is None else f"blk.{spec.layer}.{names[spec.local_name]}"


def block_type(cfg: ModelConfig, spec: WeightSpec, type_name: str) -> str | None:
    """`type_name` where a matrix `spec` in it is read as its blocks (`GGUFReader.read_int4` /
    `read_int8`); None where it is not (another type, not a matrix, values the converter changed)."""
    rebuilt = cfg.hybrid is not None and changed_by_converter(cfg, spec)
    if len(spec.shape) != 2 or rebuilt or type_name not in INT4_BLOCK_TYPES + INT8_BLOCK_TYPES:
        return None
    return type_name


def coded_specs(specs: list[WeightSpec], type_of: Callable[[WeightSpec], str | None]) -> dict[str, WeightSpec]:
    """{stored name: the file tensor's spec} of every matrix kept as blocks (`type_of`: `block_type`
    of a spec's tensor): the layers' matrices, a head of its own in 8-bit blocks, a tied head as the
    embedding table's blocks under TIED_HEAD."""
    out = {}
    for s in specs:
        kept = type_of(s) if s.role == "linear" or (s.name == TIED_HEAD and s.shape) else None
        if kept is not None and (s.role == "linear" or kept in INT8_BLOCK_TYPES):
            out[s.name] = s
    if not any(s.name == TIED_HEAD for s in specs):
        table = next((s for s in specs if s.name == "embed_tokens"), None)
        if table is not None and type_of(table) is not None:
            out[TIED_HEAD] = table
    return out


def gguf_coded_bytes(cfg: ModelConfig, tensor_types: dict[str, str], forms: CodeForms = CodeForms()) -> dict[str, int]:
    """{stored name: bytes} of the matrices a GGUF with these tensor types (its header's) keeps as
    codes, each as `forms` hold it: what `models.description.model_spec(coded=)` prices them at."""
    def type_of(spec: WeightSpec) -> str | None:
        return block_type(cfg, spec, tensor_types.get(gguf_tensor_name(cfg, spec), ""))

    return {name: coded_nbytes(type_of(spec), tuple(spec.shape), forms)
            for name, spec in coded_specs(weight_specs(cfg), type_of).items()}
