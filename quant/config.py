"""QuantConfig: how a tensor is compressed (bits, group size, group dim, symmetry).

Torch-free on purpose: `placement` sizes compressed tensors from this module alone
(`packed_nbytes`), and `placement` must never import torch.

Which dim to group along (FlexGen's choice, kept as our defaults):
- Weights, `WEIGHT_DEFAULT` (group_dim=0). In the PyTorch/HF `[out_features, in_features]`
  layout, dim 0 is the output channels, so a group is `group_size` consecutive output
  channels at one input column; each input column gets its own scale. FlexGen
  (FlexLLMGen `flex_opt.py`, `comp_weight_config`) uses group_dim=0 for its OPT weights,
  which are stored in this same layout and applied with `F.linear`; the paper picked the
  dims empirically, on OPT.
- KV cache, `KV_CACHE_DEFAULT` (group_dim=-1). FlexGen stores the cache as
  `(seq, batch*heads, head_dim)` and groups along dim 2, the head dim. Our cache is
  `[batch, kv_heads, seq, head_dim]`, so that is the last dim. Grouping along the head
  dim keeps every token's groups inside that token, so a new token is compressed alone
  and appended without touching older ones (see `quant.kv_rows.TokenGroupedRows`).

Measured on SmolLM2-135M (the built-in GGUF, WikiText-2 first 2048 tokens, window 1024,
stride 512, transformers as the model; `scripts/bench_quant.py --ppl-tokens 2048`),
perplexity vs dense 18.29:
  FlexGen weights (4 bit, g64, dim 0)                 +50.1%   0.281x fp16
  g32 along dim 1 (the GGUF's Q4_1 blocks), 8-bit params  -0.06%   0.287x fp16
  FlexGen KV (g64, head dim, K and V)                 +15.5%
  keys per channel (g64 along seq) + values head dim   +2.3%   (`quant.kv_rows.ChannelGroupedRows`)
  both of ours together                                +2.7%   (FlexGen's both: +76.6%)
So the FlexGen defaults stay the defaults (they are what FlexGen compares against), but
GGUF-sourced weights should use `QuantConfig(group_size=32, group_dim=1, param_bits=8)`.
"""
from __future__ import annotations

import dataclasses
import json
import math

SUPPORTED_BITS = (4, 8)
# Bytes of one scale/offset value per stored dtype name; scales are kept in the input's
# floating dtype (FlexGen keeps fp16 scales for fp16 data: 4 + 2*16/64 = 4.5 bits/element).
SCALE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """Group-wise min-max quantization settings.

    Args:
        bits: bits per code, 4 (two codes per byte) or 8 (one code per byte).
        group_size: elements sharing one scale (and one min when asymmetric).
        group_dim: tensor dim the groups run along; negative counts from the end.
        symmetric: if True, groups are centred on zero and store a scale only;
            if False (FlexGen's default), each group stores a scale and its min.
        param_bits: 16 stores each group's scale/min in the input dtype (FlexGen);
            8 quantizes them again, 8-bit min-max over all groups sharing an
            (outer, inner) position ("double quantization"), so group 32 costs what
            group 64 does at 16. On SmolLM2's GGUF weights, group 32 along dim 1 with
            8-bit params has relative error 1.2e-5 vs 9e-3 for FlexGen's default.
    """

    bits: int = 4
    group_size: int = 64
    group_dim: int = 0
    symmetric: bool = False
    param_bits: int = 16

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"QuantConfig.bits={self.bits} is not supported; use one of {SUPPORTED_BITS}")
        if self.group_size < 1:
            raise ValueError(f"QuantConfig.group_size={self.group_size} must be >= 1 (64 is FlexGen's default)")
        if self.param_bits not in (8, 16):
            raise ValueError(f"QuantConfig.param_bits={self.param_bits} is not supported; use 16 or 8")

    @property
    def max_code(self) -> int:
        """Largest unsigned code: 15 for 4 bits, 255 for 8 bits."""
        return (1 << self.bits) - 1

    def resolve_dim(self, ndim: int) -> int:
        """`group_dim` as a non-negative index into a tensor of `ndim` dims."""
        dim = self.group_dim + ndim if self.group_dim < 0 else self.group_dim
        if not 0 <= dim < max(ndim, 1):
            raise ValueError(
                f"QuantConfig.group_dim={self.group_dim} is out of range for a {ndim}-D tensor; "
                f"use a dim in [-{ndim}, {ndim - 1}]"
            )
        return dim

    def num_groups(self, shape: tuple[int, ...]) -> int:
        """Number of groups (scales) a tensor of `shape` is split into."""
        if len(shape) == 0:
            return 1
        dim = self.resolve_dim(len(shape))
        others = math.prod(shape) // shape[dim] if shape[dim] else 0
        return others * math.ceil(shape[dim] / self.group_size)

    def code_nbytes(self, numel: int) -> int:
        """Bytes of packed codes for `numel` elements: ceil(n/2) at 4 bits, n at 8."""
        return (numel + 1) // 2 if self.bits == 4 else numel

    def packed_nbytes(self, shape: tuple[int, ...], dtype: str = "float16") -> int:
        """Total bytes a compressed tensor takes: codes plus per-group scales (and mins).

        Args:
            shape: the uncompressed tensor's shape.
            dtype: the uncompressed dtype's name ("float16", "bfloat16", "float32");
                scales and mins are stored in it.
        """
        if dtype not in SCALE_BYTES:
            raise ValueError(f"dtype {dtype!r} cannot be quantized; use one of {sorted(SCALE_BYTES)}")
        params = 1 if self.symmetric else 2  # scale (+ min) per group
        groups = self.num_groups(tuple(shape))
        if self.param_bits == 16:
            return self.code_nbytes(math.prod(shape)) + groups * params * SCALE_BYTES[dtype]
        # 8-bit params: one byte each per group, plus an 8-bit min-max pair (step, min) in
        # `dtype` per (outer, inner) position that the groups along group_dim share.
        dim = self.resolve_dim(len(shape)) if shape else 0
        positions = math.prod(shape) // shape[dim] if shape and shape[dim] else (1 if not shape else 0)
        return self.code_nbytes(math.prod(shape)) + params * (groups + positions * 2 * SCALE_BYTES[dtype])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "QuantConfig":
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown QuantConfig fields {sorted(unknown)} in {text!r}")
        return cls(**data)


WEIGHT_DEFAULT = QuantConfig(bits=4, group_size=64, group_dim=0, symmetric=False)
KV_CACHE_DEFAULT = QuantConfig(bits=4, group_size=64, group_dim=-1, symmetric=False)
# The engine's compressed KV cache (quant.kv_rows): values as KV_CACHE_DEFAULT (groups along the
# head dim, the policy's group size), keys per channel over 32 consecutive tokens (KIVI; groups
# along the sequence dim, -2 of a [..., seq, head_dim] tensor), which keeps SmolLM2's 4-bit
# cache within about 2% of full-precision WikiText perplexity where head-dim keys cost +14%.
KV_KEYS_PER_CHANNEL = QuantConfig(bits=4, group_size=32, group_dim=-2, symmetric=False)


def engine_weight_config(bits: int = 4) -> QuantConfig:
    """The layout the offload engine stores compressed weights in: groups of 32 along the input
    channels (the layout of GGUF's Q4 blocks and of GPTQ/AWQ groups). At 4 bits a scale and a
    zero point per group in the compute dtype (0.3125x the 16-bit bytes): torch's int4 kernel's
    format, multiplied in place (`quant.int4_weight.Int4Weight`); at 8 bits with 8-bit group
    parameters. FlexGen's output-channel groups of 64 cost SmolLM2 +42% WikiText perplexity;
    groups of 32 along the inputs with 8-bit parameters are within 0.1% at 0.287x."""
    return QuantConfig(bits=bits, group_size=32, group_dim=1, param_bits=16 if bits == 4 else 8)


def engine_weight_bytes_per_element(bits: int, dtype: str) -> float:
    """Stored bytes per element of a large matrix in `engine_weight_config(bits)`."""
    config = engine_weight_config(bits)
    cols = 128 * config.group_size  # wide enough that 8-bit parameters' per-row pair is noise
    return config.packed_nbytes((1, cols), dtype) / cols
