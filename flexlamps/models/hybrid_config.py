"""`HybridConfig`: what a model mixing gated-DeltaNet (linear attention) layers with full attention
adds to a `ModelConfig` (transformers' `qwen3_next`, `qwen3_5_text`). Torch-free.

A DeltaNet layer keeps, per sequence, a fixed-size state instead of a KV cache that grows with
the context: the last `conv_kernel - 1` inputs of its causal depthwise convolution (over the
concatenated q, k, v: `conv_dim` channels, in the compute dtype) and one `key_head_dim x
value_head_dim` matrix per value head (float32, as the reference keeps it). Full-attention layers
are the usual GQA with q/k RMSNorms, partial rotary and a sigmoid output gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LINEAR, FULL = "linear_attention", "full_attention"
RECURRENT_STATE_BYTES = 4  # the recurrent matrices stay float32 whatever the compute dtype
# the chunked form's chunk; states are kept at its boundaries. transformers' is 64, but a decode runs
# its open chunk padded to a whole chunk: at 16 a decode step costs what the recurrent form's does and
# a prompt no more than at 64 (docs/models.md, scripts/bench_delta_rule.py)
DELTA_RULE_CHUNK = 16


@dataclass(frozen=True, kw_only=True)
class HybridConfig:
    layer_types: tuple[str, ...]  # per layer: LINEAR or FULL
    num_key_heads: int
    num_value_heads: int  # a multiple of num_key_heads: each q/k head serves value_heads / key_heads
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    rotary_dim: int  # the leading dims of a full-attention head that rotate (partial rotary)
    fused_projections: bool  # Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head; Qwen3.5: four

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    def is_linear(self, layer: int) -> bool:
        return self.layer_types[layer] == LINEAR

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    def conv_state_bytes(self, dtype_bytes: int) -> int:
        return self.conv_dim * (self.conv_kernel - 1) * dtype_bytes

    @property
    def recurrent_state_bytes(self) -> int:
        return self.num_value_heads * self.key_head_dim * self.value_head_dim * RECURRENT_STATE_BYTES

    def open_chunk_bytes(self, dtype_bytes: int) -> int:
        """The tokens since the state's last chunk boundary (at most DELTA_RULE_CHUNK - 1): k, v and
        beta in the compute dtype, g in float32 (models.blocks.aligned_delta_rule)."""
        per_token = (self.key_dim + self.value_dim + self.num_value_heads) * dtype_bytes + self.num_value_heads * 4
        return (DELTA_RULE_CHUNK - 1) * per_token

    def state_bytes_per_layer(self, dtype_bytes: int) -> int:
        """Bytes one sequence holds in one DeltaNet layer, whatever its length."""
        return self.conv_state_bytes(dtype_bytes) + self.recurrent_state_bytes + self.open_chunk_bytes(dtype_bytes)


def layer_types_from_hf(hf: dict[str, Any]) -> tuple[str, ...]:
    """transformers' rule: `layer_types` when given, else every `full_attention_interval`-th layer
    (default 4) is full attention. An unknown layer type is a KeyError-free ValueError naming it."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        every = hf.get("full_attention_interval", 4)
        types = [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries for {n} layers")
    unknown = sorted(set(types) - {LINEAR, FULL})
    if unknown:
        raise ValueError(f"layer type(s) {', '.join(map(repr, unknown))} are not supported ({LINEAR!r}, {FULL!r} are)")
    return tuple(types)
