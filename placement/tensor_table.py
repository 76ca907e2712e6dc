"""`TensorTable`: a model's weights as the planner sizes them, one row per tensor of a layer.

The model's family builds it (`flexlamps.models.description.tensor_table`) from the same weight
list the loaders read and the executor stores, with the bytes each tensor takes as its checkpoint
keeps it (dtype, FP8 codes and tile scales, MXFP4 blocks; a GGUF's blocks kept as codes at the bytes
their weight kind holds them in, `models.loading.gguf_codes`); placement only sums rows, so the
planner and the engine count the same tensors. Layers with the same tensor share a row (`layers`
lists them), and a MoE layer's routed experts share one (`copies` of them, `routed`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from placement.jsonable import JsonMixin
from placement.specs import DTYPE_BYTES

# WeightSpec roles: "linear" (a matmul weight, compressible), "router" (the MoE gate, the indexer's
# head weights: small, never compressed), "absorbed" (MLA's kv_b, sliced per head), "norm", "bias",
# "embed" (token embedding, output head)
KINDS = ("linear", "router", "absorbed", "norm", "bias", "embed")
MATRIX_KINDS = ("linear", "router", "absorbed")
VECTOR_KINDS = ("norm", "bias")
# how a tensor is stored: "dense" in the table's dtype; "fp8" (codes and fp32 tile scales, an FP8
# checkpoint's matrices); "mxfp4" (4-bit codes and a byte per 32, gpt-oss's experts); "codes" (a
# checkpoint's blocks the engine keeps and multiplies as they are, a GGUF's: `stored_bytes` as their
# weight kind holds them, e.g. Q4_K at 4.625 bits a weight; they keep those bytes in any dtype)
ENCODINGS = ("dense", "fp8", "mxfp4", "codes")


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorRow(JsonMixin):
    name: str  # its name inside a layer ("q_proj", "experts.gate_proj"), or the model's ("embed_tokens")
    shape: tuple[int, ...]
    kind: str  # one of KINDS
    layers: tuple[int, ...] = ()  # the layers holding it; (): a model tensor (embedding, head, final norm)
    copies: int = 1  # per layer: a MoE layer's routed experts (one row, `copies` experts)
    routed: bool = False  # a routed expert's: a step reads only the copies its tokens pick
    active: int = 0  # copies one token multiplies (a routed row: the experts per token); 0: every copy
    encoding: str = "dense"  # one of ENCODINGS
    stored_bytes: int  # one copy as the checkpoint keeps it
    flops_per_token: float = 0.0  # one token through one copy (2 per weight it multiplies or adds)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))  # lists from JSON
        object.__setattr__(self, "layers", tuple(self.layers))
        if self.kind not in KINDS or self.encoding not in ENCODINGS:
            raise ValueError(f"TensorRow {self.name}: kind must be one of {KINDS} and encoding one of "
                             f"{ENCODINGS}, got {self.kind!r}, {self.encoding!r}")
        if not self.active:
            object.__setattr__(self, "active", self.copies)
        if not 1 <= self.active <= self.copies or self.stored_bytes < 0:
            raise ValueError(f"TensorRow {self.name}: 1 <= active <= copies and stored_bytes >= 0, got "
                             f"{self.active}, {self.copies}, {self.stored_bytes}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_matrix(self) -> bool:
        return self.kind in MATRIX_KINDS

    @property
    def instances(self) -> int:
        """Copies in the whole model (a model tensor counts once)."""
        return self.copies * max(len(self.layers), 1)

    @property
    def is_2d_matrix(self) -> bool:
        return self.is_matrix and len(self.shape) == 2


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorTable(JsonMixin):
    num_layers: int
    dtype: str  # the dense rows' stored dtype (a placement.specs.DTYPE_BYTES key)
    rows: tuple[TensorRow, ...] = field(default_factory=tuple)

    def __post_init__(self):
        rows = tuple(r if isinstance(r, TensorRow) else TensorRow.from_dict(r) for r in self.rows)
        object.__setattr__(self, "rows", rows)
        for r in rows:
            if any(not 0 <= i < self.num_layers for i in r.layers):
                raise ValueError(f"TensorTable: row {r.name} names layers {r.layers} of {self.num_layers}")

    def in_dtype(self, dtype: str) -> "TensorTable":
        """The table with its dense rows stored in `dtype` (a run's compute dtype)."""
        ratio = DTYPE_BYTES[dtype] / DTYPE_BYTES[self.dtype]
        rows = tuple(dataclasses.replace(r, stored_bytes=round(r.stored_bytes * ratio)) if r.encoding == "dense" else r
                     for r in self.rows)
        return dataclasses.replace(self, dtype=dtype, rows=rows)

    @property
    def layered_rows(self) -> list[TensorRow]:
        return [r for r in self.rows if r.layers]

    def layer_rows(self, layer: int) -> list[TensorRow]:
        return [r for r in self.rows if layer in r.layers]

    @property
    def model_rows(self) -> list[TensorRow]:
        """The tensors outside the layers: embedding, output head, final norm (OPT: positions)."""
        return [r for r in self.rows if not r.layers]

    # ---- sums over the whole model -------------------------------------------------------------
    def total_params(self) -> int:
        return sum(r.numel * r.instances for r in self.rows)

    def total_bytes(self) -> int:
        return sum(r.stored_bytes * r.instances for r in self.rows)

    def codes_bytes(self) -> int:
        """Stored bytes of the tensors kept as a checkpoint's blocks (encoding "codes")."""
        return sum(r.stored_bytes * r.instances for r in self.rows if r.encoding == "codes")

    def model_bytes(self) -> int:
        """Stored bytes of the tensors outside the layers."""
        return sum(r.stored_bytes * r.instances for r in self.model_rows)

    def layers_bytes(self) -> int:
        """Stored bytes of all decoder layers together."""
        return self.total_bytes() - self.model_bytes()

    def layers_params(self) -> int:
        return sum(r.numel * r.instances for r in self.rows if r.layers)

    # ---- one layer -----------------------------------------------------------------------------
    def layer_bytes(self, layer: int) -> int:
        return sum(r.stored_bytes * r.copies for r in self.layer_rows(layer))

    def layer_params(self, layer: int) -> int:
        return sum(r.numel * r.copies for r in self.layer_rows(layer))

    def layer_active_params(self, layer: int) -> int:
        """Parameters of `layer` one token uses (a routed row's `active` copies)."""
        return sum(r.numel * r.active for r in self.layer_rows(layer))

    def layer_flops_per_token(self, layer: int) -> float:
        """GEMM FLOPs one token costs in `layer`: every matrix it multiplies (`active` copies)."""
        return sum(r.flops_per_token * r.active for r in self.layer_rows(layer))

    def head_flops_per_token(self) -> float:
        return sum(r.flops_per_token for r in self.model_rows)
