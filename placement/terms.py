"""`build_terms`: every affine term of the cost model (prompt, decode, memory) for one `Choice`."""

import dataclasses

from placement.choice import Choice, CostTerms, LatentTerms
from placement.cost_decode import decode_terms
from placement.cost_memory import head_staged, memory_rows, weight_staging
from placement.cost_prompt import prompt_terms
from placement.expert_compute import cpu_expert_tokens
from placement.latent_pools import LatentMissCurves, MissEnvelope
from placement.layer_sizes import layer_sizes
from placement.model_spec import ModelSpec
from placement.specs import HardwareSpec, WorkloadSpec
from placement.weight_calls import int4_runs_in_place


def build_terms(choice: Choice, model: ModelSpec, hardware: HardwareSpec,
                workload: WorkloadSpec) -> CostTerms:
    """All affine terms of the cost model for one discrete choice."""
    if choice.latent_pools and not model.index_topk:
        choice = dataclasses.replace(choice, latent_pools=False)
    # time and memory follow one rule: 4-bit calls run in place only where the kernel exists
    choice = dataclasses.replace(choice, int4_kernel=int4_runs_in_place(hardware, model.dtype))
    if choice.cpu_expert_tokens is None:
        most = choice.gpu_batch_size * choice.num_gpu_batches * workload.prompt_len
        choice = dataclasses.replace(choice, cpu_expert_tokens=cpu_expert_tokens(
            model, hardware, compressed=choice.compress_weight, most_tokens=most))
    sz = layer_sizes(choice, model, workload)
    latent = _latent_terms(choice, sz, model, hardware, workload) if choice.latent_pools else None
    staging = weight_staging(choice, sz, model, workload)
    return CostTerms(
        prefill=prompt_terms(choice, sz, model, hardware, workload),
        decode=decode_terms(choice, sz, model, hardware, workload),
        memory=memory_rows(choice, sz, model, workload, staging), staging=staging,
        num_layers=model.num_layers, num_decode_steps=workload.gen_len - 1,
        tokens_per_block=choice.gpu_batch_size * choice.num_gpu_batches * workload.gen_len,
        cache_gpu_bounds=_cache_gpu_bounds(model, latent), latent=latent,
        cpu_expert_tokens=choice.cpu_expert_tokens, head_staged=(head_staged(model), model.vocab_size))


def _cache_gpu_bounds(model: ModelSpec, latent: "LatentTerms | None") -> tuple[float, float]:
    """An MLA cache leaves the gpu tier only in ESS's layout (pools of at least one step's
    top-k); the engine keeps a latent cache without pools whole on the gpu tier."""
    if latent is not None:
        return latent.envelope.floor, 1.0
    return (1.0, 1.0) if model.arch == "mla" else (0.0, 1.0)


def _latent_terms(choice, sz, model, hardware, workload) -> LatentTerms:
    """The miss copies of `Choice.latent_pools`: per layer and step, the block's misses (a
    fraction of the top-k, per sequence) cross from the cpu tier as stored records."""
    curves = hardware.latent_miss_curves or LatentMissCurves.ess()
    context = workload.prompt_len + workload.gen_len
    envelope = MissEnvelope(curves, model.num_layers, model.index_topk / context)
    block = choice.gpu_batch_size * choice.num_gpu_batches
    copy_s = block * min(model.index_topk, context) * sz.cache_stored / hardware.cpu_to_gpu_bytes_per_s
    per_miss = {"ctog": copy_s}
    if hardware.gpu_is_host:  # a memcpy on the cores that compute (see layer_seconds)
        per_miss["comp"] = copy_s
    return LatentTerms(envelope, per_miss)
