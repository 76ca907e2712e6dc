"""flexlamps' placement planner: where weights, KV cache and activations live, and how to batch.

Pure numpy/scipy (never imports torch), so it can be used on its own to size deployments:

    import placement
    model = placement.model_preset("opt-30b")  # or flexlamps.models.description.model_spec(config)
    hw = placement.hardware_preset("t4-flexgen")          # or HardwareSpec.from_json(profile)
    plan = placement.solve(model, hw, placement.WorkloadSpec(prompt_len=512, gen_len=32))
    plan.policy, plan.tokens_per_s

The engine reads `plan.policy` (a `Policy`); these names are a stable contract:
    gpu_batch_size, num_gpu_batches          sequences per micro-batch, micro-batches per block
    weights, cache, activations              `TierSplit(gpu=, cpu=, disk=)`, fractions summing to 1
    compress_weight, compress_cache          group-wise quantized storage (`compression`: bits, group)
    cpu_attention                            decode attention over off-GPU cache runs on the CPU
    cpu_expert_tokens                        MoE: cpu-tier experts run on the CPU below this many tokens each
A MoE model's `ModelSpec.routing` (a `placement.routing.RoutingProfile` measured by `flexlamps profile
--prompts`) prices the experts a step reads; without one, routing is uniform. `ModelSpec.tensors`
(a `TensorTable`, built by the model's family) lists every weight: a row per tensor of a layer.
`solve` searches only what the engine runs as planned (`capabilities=`, an `EngineCapabilities`;
the default is flexlamps' offload engine). `predict(policy, model, hardware, workload)` gives the time breakdown of any policy (and
`evaluate` the same as a `Plan`, with peak memory against the budgets), so measured runs can
be compared with the model. `solve` raises `InfeasiblePlanError` (with
`.constraint` and `.shortfall_bytes`) when nothing fits.
"""

from placement.cost import CostBreakdown, predict
from placement.latent_pools import LatentMissCurves
from placement.model_spec import ModelSpec
from placement.plan import InfeasiblePlanError, Plan
from placement.presets import hardware_preset, model_preset
from placement.search import evaluate, solve
from placement.specs import (CompressionSpec, EngineCapabilities, HardwareSpec, Policy, TierSplit,
                             WorkloadSpec)
from placement.tensor_table import TensorRow, TensorTable
from placement.units import format_bytes, parse_bytes
from placement.weight_calls import int4_runs_in_place

__all__ = [
    "CompressionSpec", "CostBreakdown", "EngineCapabilities", "HardwareSpec", "InfeasiblePlanError",
    "LatentMissCurves", "ModelSpec",
    "Plan", "Policy", "TensorRow", "TensorTable", "TierSplit", "WorkloadSpec", "format_bytes", "hardware_preset",
    "evaluate", "int4_runs_in_place", "model_preset", "parse_bytes", "predict", "solve",
]
