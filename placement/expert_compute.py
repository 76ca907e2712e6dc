"""Where a MoE layer's cpu-tier experts are computed (Fiddler's and KTransformers' choice).

Few tokens per expert: on the CPU where the expert lives, its tokens sent there and its output
back (a few KiB), so the expert's bytes never cross the link; many: copied to the GPU for a
batched GEMM. The engine takes the first while a layer's routed tokens per expert are fewer
than `Policy.cpu_expert_tokens`, which the planner sets here from the machine's rates:

    in place   max(expert bytes / CPU memory bandwidth, t * 6 h f / CPU FLOP/s)
    copied     expert bytes / host-to-GPU bandwidth (its GEMM on the GPU is noise beside that)

On a CPU-only machine both tiers are one memory: in place costs nothing and a copy only charges
the gpu tier, so every call computes in place. Beside a GPU the engine computes only plain
(uncompressed) experts in place: a 4-bit expert there is stored in the GPU kernel's layout.
"""

from __future__ import annotations

from placement.model_spec import ModelSpec
from placement.specs import HardwareSpec

# tokens per expert searched for the crossover; past it a CPU always loses to a copy
_MAX_SCAN = 4096


def tokens_per_expert(model: ModelSpec, rows: float) -> float:
    """Routed tokens per distinct expert a call of `rows` tokens sends (`ModelSpec.expected_experts`)."""
    distinct = model.expected_experts(rows)
    return rows * model.num_experts_per_token / distinct if distinct else 0.0


def expert_flops_per_token(model: ModelSpec) -> float:
    """GEMM FLOPs one token costs in one routed expert (its three matrices)."""
    return 2 * 3 * model.hidden_size * model.moe_intermediate_size


def cpu_expert_tokens(model: ModelSpec, hardware: HardwareSpec, *, compressed: bool, most_tokens: int) -> int:
    """The engine's switch (`Policy.cpu_expert_tokens`) for this model and machine: `most_tokens`
    + 1 (every call in place) on a CPU-only machine, 0 (always copied) for compressed experts
    beside a GPU, else the tokens per expert from which copying is faster."""
    if not model.num_experts:
        return 0
    if hardware.gpu_is_host:
        return most_tokens + 1
    if compressed:
        return 0
    expert_bytes = 3 * model.hidden_size * model.moe_intermediate_size * model.matrix_bytes_per_param
    copy_s = expert_bytes / hardware.cpu_to_gpu_bytes_per_s
    cpu_flops = hardware.cpu_matmul_flops_per_s.get(model.dtype) or max(hardware.cpu_matmul_flops_per_s.values())
    for t in range(1, _MAX_SCAN + 1):
        in_place_s = max(expert_bytes / hardware.cpu_memory_bytes_per_s, t * expert_flops_per_token(model) / cpu_flops)
        if in_place_s >= copy_s:
            return t
    return _MAX_SCAN


def cpu_experts_seconds(model: ModelSpec, hardware: HardwareSpec, rows: float, experts_stored: float) -> float:
    """Seconds the CPU takes for the average layer's routed experts on a call of `rows` tokens,
    all of them in host memory (`experts_stored`: the layer's routed experts' stored bytes): it
    streams the distinct experts picked and does their tokens' FLOPs, whichever is longer."""
    if not model.num_experts:
        return 0.0
    read = experts_stored * model.expected_experts(rows) / model.num_experts
    flops = rows * model.num_experts_per_token * expert_flops_per_token(model) * model.moe_layer_share
    cpu_flops = hardware.cpu_matmul_flops_per_s.get(model.dtype) or max(hardware.cpu_matmul_flops_per_s.values())
    return max(read / hardware.cpu_memory_bytes_per_s, flops / cpu_flops)
