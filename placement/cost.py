"""Analytic cost model: per-layer I/O and compute times and per-tier peak memory of a policy.

Starts from FlexGen's model (ICML'23, §4 and experimental/cost_model.py):
    prefill layer  = max(ctog + dtoc, gtoc + ctod, comp)
    decode layer   = ctog + max(gtoc, dtoc, ctod, comp, routed)
    total          = L * prefill + L * (gen_len - 1) * decode,  throughput = block * gen_len / total
with ctog/gtoc = CPU->GPU / GPU->CPU copies, dtoc/ctod = disk reads / writes. Extended with:
  - cache sizes per architecture (GQA, MLA latent; sparse selection reads only top-k entries);
  - compressed sizes for weights *and* cache, and the cost of dequantizing them (per element
    and per matrix);
  - a GPU memory-bandwidth roofline for decode GEMMs (each call re-reads the layer), or the
    GEMM rate the profile measured at that many rows (CPUs fall short of both bounds);
  - decode micro-batches merged into one call per layer (`Policy.merge_decode`, what this
    engine does; FlexGen runs them one by one), which reserves the block's workspace;
  - attention on the CPU for the cache not on the GPU (`cpu_attention`), else the cache moves;
  - a shared prompt prefix computed and stored once per block;
  - a fixed cost per layer and micro-batch (launches, dispatch), measured by the profile;
  - the memory-bound elementwise passes (norms, rotary, activation) at memory bandwidth;
  - attention at the rate the profile measured the engine's at (`HardwareSpec.attention_seconds`), else the GEMM peak;
  - on a CPU standing in for the GPU, tier copies as compute work (they share its cores);
  - a MoE layer's routed experts read off disk only once its router names them: those reads
    wait for the layer's compute before the router (and the last one's expert computes after
    it lands), the decode term `routed` (`cost_experts.routed_reads_s`).
Embedding and output-head weights are spread evenly over the layers and share the layers'
fractions: the engine cuts each table by vocab rows in those fractions, so every tier holds
its counted share of them.

Every quantity is affine in the nine placement fractions
    x = [w_gpu, w_cpu, w_disk, c_gpu, c_cpu, c_disk, h_gpu, h_cpu, h_disk]
(w: weights, c: cache, h: activations), so the same `Affine` terms feed both `predict` and
the LP in `placement.lp`, which therefore cannot disagree.
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from placement.affine import W_GPU, Affine, fractions_of
from placement.choice import Choice, CostTerms
from placement.expert_cache_terms import with_expert_hits
from placement.model_spec import ModelSpec
from placement.specs import HardwareSpec, Policy, WorkloadSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class CostBreakdown:
    """What `predict` returns: the times of a policy, its peak bytes per tier."""

    tokens_per_s: float  # generated tokens per second
    total_s: float  # one block: prefill + all decode steps
    prefill_s: float
    decode_s: float
    prefill_layer_s: dict[str, float]  # per-layer terms: ctog, gtoc, dtoc, ctod, comp
    decode_layer_s: dict[str, float]
    peak_bytes: dict[str, float]  # MEMORY_ROWS


def prefill_layer_time(terms: dict[str, Affine], x: np.ndarray) -> float:
    v = {k: a(x) for k, a in terms.items()}
    return max(v["ctog"] + v["dtoc"], v["gtoc"] + v["ctod"], v["comp"])


def decode_layer_values(terms: CostTerms, x: np.ndarray) -> dict[str, float]:
    """Each decode term of one layer in seconds, the latent pools' miss copies included."""
    v = {k: a(x) for k, a in terms.decode.items()}
    if terms.latent is not None:
        misses = terms.latent.misses(x)
        for name, seconds in terms.latent.decode_s_per_miss.items():
            v[name] += seconds * misses
    return v


def decode_layer_time(terms: CostTerms, x: np.ndarray) -> float:
    v = decode_layer_values(terms, x)
    return v["ctog"] + max(v["gtoc"], v["dtoc"], v["ctod"], v["comp"], v["routed"])


def total_time(terms: CostTerms, x: np.ndarray) -> float:
    return terms.num_layers * (prefill_layer_time(terms.prefill, x)
                               + terms.num_decode_steps * decode_layer_time(terms, x))


def predict(policy: Policy, model: ModelSpec, hardware: HardwareSpec,
            workload: WorkloadSpec) -> CostBreakdown:
    """Predicted throughput and time breakdown of `policy` (memory limits are not checked)."""
    terms = terms_of_policy(policy, model, hardware, workload)
    x = fractions_of(policy)
    prefill_s = terms.num_layers * prefill_layer_time(terms.prefill, x)
    decode_s = terms.num_layers * terms.num_decode_steps * decode_layer_time(terms, x)
    total_s = prefill_s + decode_s
    return CostBreakdown(
        tokens_per_s=terms.tokens_per_block / total_s, total_s=total_s,
        prefill_s=prefill_s, decode_s=decode_s,
        prefill_layer_s={k: a(x) for k, a in terms.prefill.items()},
        decode_layer_s=decode_layer_values(terms, x),
        peak_bytes=memory_at(terms, x))


def memory_at(terms: CostTerms, x: np.ndarray) -> dict[str, float]:
    """Each memory row's bytes at fractions `x` (`CostTerms.memory_value`), less a dense model's
    output head's staged chunk where `x` keeps every vocab row of it on the gpu tier (the engine
    stages none then; a MoE model's staging prices the head's rows off the gpu tier)."""
    rows = {name: terms.memory_value(name, x) for name in terms.memory}
    staged, vocab = terms.head_staged
    if terms.staging is None and (1.0 - float(x[W_GPU])) * vocab < 0.5:
        rows["gpu_head"] -= staged
    return rows


def terms_of_policy(policy: Policy, model: ModelSpec, hardware: HardwareSpec,
                    workload: WorkloadSpec) -> CostTerms:
    """`build_terms` for a given policy, its per-layer latent pools included."""
    terms = with_expert_hits(Choice.of(policy), model, hardware, workload, fractions_of(policy))
    if terms.latent is not None and policy.latent_pools:
        terms.latent = dataclasses.replace(terms.latent, pools=policy.latent_pools)
    return terms
