"""Analytic cost model: per-layer I/O and compute times and per-tier peak memory of a policy.

Starts from FlexGen's model (ICML'23, §4 and experimental/cost_model.py):
    prefill layer  = max(ctog + dtoc, gtoc + ctod, comp)
    decode layer   = ctog + max(gtoc, dtoc, ctod, comp)
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
  - on a CPU standing in for the GPU, tier copies as compute work (they share its cores).
Embedding and output-head weights are spread evenly over the layers and share the layers'
fractions: the engine cuts each table by vocab rows in those fractions, so every tier holds
its counted share of them.

Every quantity is affine in the nine placement fractions
    x = [w_gpu, w_cpu, w_disk, c_gpu, c_cpu, c_disk, h_gpu, h_cpu, h_disk]
(w: weights, c: cache, h: activations), so the same `Affine` terms feed both `predict` and
the LP in `placement.lp`, which therefore cannot disagree.
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from placement.expert_compute import (cpu_expert_tokens, cpu_experts_seconds, expert_flops_per_token,
                                      tokens_per_expert)
from placement.expert_groups import experts_read, staged_share
from placement.latent_pools import LatentMissCurves, MissEnvelope
from placement.model_spec import LINEAR_CHUNK, ModelSpec
from placement.specs import CompressionSpec, EngineCapabilities, HardwareSpec, Policy, WorkloadSpec

NUM_FRACTIONS = 9
W_GPU, W_CPU, W_DISK, C_GPU, C_CPU, C_DISK, H_GPU, H_CPU, H_DISK = range(NUM_FRACTIONS)
PREFILL_TERMS = ("ctog", "gtoc", "dtoc", "ctod", "comp")
DECODE_TERMS = PREFILL_TERMS
MEMORY_ROWS = ("gpu_prefill", "gpu_decode", "cpu_prefill", "cpu_decode", "disk")


class Affine:
    """const + coef . x over the nine fractions."""

    __slots__ = ("const", "coef")

    def __init__(self, const: float = 0.0, coef: np.ndarray | None = None):
        self.const = float(const)
        self.coef = np.zeros(NUM_FRACTIONS) if coef is None else coef

    def add(self, amount: float, *indices: int) -> "Affine":
        """Add `amount * (x[i] + x[j] + ...)`, or a constant when no index is given."""
        if not indices:
            self.const += amount
        for idx in indices:
            self.coef[idx] += amount
        return self

    def plus(self, other: "Affine") -> "Affine":
        """Add another affine form in place."""
        self.const += other.const
        self.coef = self.coef + other.coef
        return self

    def __call__(self, x: np.ndarray) -> float:
        return self.const + float(self.coef @ x)

    def scaled(self, factor: float) -> "Affine":
        return Affine(self.const * factor, self.coef * factor)


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The discrete part of a policy: what the search enumerates and the LP holds fixed."""

    gpu_batch_size: int
    num_gpu_batches: int
    compress_weight: bool = False
    compress_cache: bool = False
    cpu_attention: bool = False
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    merge_decode: bool = True
    # a sparse-attention MLA model's latent cache in ESS's layout: all of it on the cpu tier,
    # per layer a gpu pool (what c_gpu measures), misses copied each step (`placement.latent_pools`)
    latent_pools: bool = False
    # the engine's switch for 4-bit weights (`EngineCapabilities.int4_in_place_below_rows`)
    int4_in_place_below_rows: int = EngineCapabilities().int4_in_place_below_rows
    # whether the machine has the fused 4-bit kernel for the model's dtype (`int4_runs_in_place`;
    # set from the hardware by `build_terms`): without it every call dequantizes
    int4_kernel: bool = True
    # a MoE layer's cpu-tier experts run on the CPU below this many tokens per expert
    # (`Policy.cpu_expert_tokens`); None: the planner's own switch for the machine (`build_terms`)
    cpu_expert_tokens: int | None = None
    # the share of a decode step's reads of cached-kind experts (off disk; beside a GPU, copies off
    # the cpu tier too) the engine's expert cache serves (`placement.expert_cache_terms`)
    expert_hits: float = 0.0
    # the disk fraction holds routed experts only, each read as routed: the engine places a MoE
    # layer's dense parts and the head on the faster tiers first (set where the fractions allow it)
    disk_experts_only: bool = False
    # a MoE layer's routed experts staged at once, at most (`Policy.expert_group`; 0: all a sweep picks)
    expert_group: int = 0

    @classmethod
    def of(cls, policy: Policy) -> "Choice":
        return cls(gpu_batch_size=policy.gpu_batch_size, num_gpu_batches=policy.num_gpu_batches,
                   compress_weight=policy.compress_weight, compress_cache=policy.compress_cache,
                   cpu_attention=policy.cpu_attention, compression=policy.compression,
                   merge_decode=policy.merge_decode, latent_pools=policy.cache.gpu < 1,
                   cpu_expert_tokens=policy.cpu_expert_tokens, expert_group=policy.expert_group)

    def decode_calls(self) -> tuple[int, int]:
        """(calls, rows per call) a layer runs per decode step: the block merged, or each
        micro-batch in turn."""
        if self.merge_decode:
            return 1, self.gpu_batch_size * self.num_gpu_batches
        return self.num_gpu_batches, self.gpu_batch_size


@dataclass(slots=True)
class CostTerms:
    """Affine per-layer times (seconds) and peak memory rows (bytes) for one `Choice`."""

    prefill: dict[str, Affine]  # PREFILL_TERMS
    decode: dict[str, Affine]  # DECODE_TERMS
    memory: dict[str, Affine]  # MEMORY_ROWS
    num_layers: int
    num_decode_steps: int  # gen_len - 1
    tokens_per_block: int  # block size * gen_len
    cache_gpu_bounds: tuple[float, float] = (0.0, 1.0)  # what the engine can run for c_gpu
    latent: "LatentTerms | None" = None  # the pools' misses, for `Choice.latent_pools`
    cpu_expert_tokens: int = 0  # the switch priced (`Choice.cpu_expert_tokens`), for the plan's policy


@dataclass(frozen=True, slots=True)
class LatentTerms:
    """Decode copies of an offloaded latent cache's misses: with m the mean misses per layer
    (a fraction of the top-k, per sequence per step), they add `m * decode_s_per_miss[term]`
    to each decode term; m >= the envelope of the layers' miss curves at c_gpu."""

    envelope: MissEnvelope
    decode_s_per_miss: dict[str, float]
    pools: tuple[float, ...] = ()  # given per-layer pools (a policy's); empty: the best split of c_gpu

    def misses(self, x: np.ndarray) -> float:
        if self.pools:
            return self.envelope.misses_at(self.pools)
        return self.envelope.value(float(x[C_GPU]))


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


def fractions_of(policy: Policy) -> np.ndarray:
    return np.array(policy.weights.as_tuple() + policy.cache.as_tuple()
                    + policy.activations.as_tuple(), dtype=float)


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
    return v["ctog"] + max(v["gtoc"], v["dtoc"], v["ctod"], v["comp"])


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
        peak_bytes={k: a(x) for k, a in terms.memory.items()})


@dataclass(frozen=True, slots=True)
class _Sizes:
    """Bytes and FLOPs of one layer for one block, derived once per `Choice`."""

    weight_stored: float  # one layer's weights as stored (compressed or not), embeddings spread
    weight_fp16: float  # the same, uncompressed (what GEMMs read)
    layer_stored: float  # one layer's own weights as stored, no embedding share (what streams)
    layer_matrices: float  # its 2-D matrices uncompressed (what compressed weights expand to)
    experts_stored: float  # its routed experts as stored (fetched only as tokens route to them)
    cache_stored: float  # cache bytes per token per layer as stored
    cache_fp16: float  # uncompressed
    indexer: float  # indexer key bytes per token per layer (GPU-resident)
    state: float  # fixed bytes per sequence per layer (hybrid models' DeltaNet states, never compressed)
    hidden: float  # hidden-state bytes per token
    query: float  # query bytes per token (sent to the CPU for CPU attention)


def _sizes(choice: Choice, model: ModelSpec, workload: WorkloadSpec) -> _Sizes:
    dtype_bytes = model.dtype_bytes
    ratio = choice.compression.weight_bytes_per_element(dtype_bytes) / dtype_bytes
    capacity = workload.prompt_len + workload.gen_len
    cache_ratio = choice.compression.cache_bytes_per_element(capacity, dtype_bytes) / dtype_bytes
    # norms, biases and embeddings stay dense; only the layers' matrices are quantized, from
    # their values in dtype (an FP8 checkpoint's too: `per_stored` turns its bytes into those)
    per_stored = dtype_bytes / model.matrix_bytes_per_param
    # what compression leaves as it is: vectors, and the matrices the engine never compresses
    layer_dense = (model.vector_param_count() * dtype_bytes
                   + model.uncompressed_matrix_param_count() * model.matrix_bytes_per_param)
    dense = layer_dense + model.embedding_bytes() / model.num_layers
    weight = model.weight_bytes_per_layer() + model.embedding_bytes() / model.num_layers
    stored = (weight - dense) * per_stored * ratio + dense if choice.compress_weight else weight
    cache = model.cache_bytes_per_token_per_layer()
    layer = model.weight_bytes_per_layer()
    layer_stored = (layer - layer_dense) * per_stored * ratio + layer_dense if choice.compress_weight else layer
    return _Sizes(
        weight_stored=stored, weight_fp16=weight, layer_stored=layer_stored,
        layer_matrices=(layer - layer_dense) * per_stored,
        experts_stored=model.routed_expert_bytes_per_layer() * (per_stored * ratio if choice.compress_weight else 1.0),
        cache_stored=cache * (cache_ratio if choice.compress_cache else 1.0), cache_fp16=cache,
        indexer=model.indexer_bytes_per_token_per_layer(),
        state=model.state_bytes_per_sequence_per_layer(),
        hidden=model.hidden_size * dtype_bytes,
        query=model.num_heads * (model.head_dim + model.qk_rope_head_dim) * dtype_bytes)


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
    sz = _sizes(choice, model, workload)
    latent = _latent_terms(choice, sz, model, hardware, workload) if choice.latent_pools else None
    return CostTerms(
        prefill=_prefill_terms(choice, sz, model, hardware, workload),
        decode=_decode_terms(choice, sz, model, hardware, workload),
        memory=_memory_rows(choice, sz, model, workload),
        num_layers=model.num_layers, num_decode_steps=workload.gen_len - 1,
        tokens_per_block=choice.gpu_batch_size * choice.num_gpu_batches * workload.gen_len,
        cache_gpu_bounds=_cache_gpu_bounds(model, latent), latent=latent,
        cpu_expert_tokens=choice.cpu_expert_tokens)


def terms_of_policy(policy: Policy, model: ModelSpec, hardware: HardwareSpec,
                    workload: WorkloadSpec) -> CostTerms:
    """`build_terms` for a given policy, its per-layer latent pools included."""
    from placement.expert_cache_terms import with_expert_hits  # it builds on this module

    terms = with_expert_hits(Choice.of(policy), model, hardware, workload, fractions_of(policy))
    if terms.latent is not None and policy.latent_pools:
        terms.latent = dataclasses.replace(terms.latent, pools=policy.latent_pools)
    return terms


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
    if hardware.gpu_is_host:  # a memcpy on the cores that compute (see _layer_seconds)
        per_miss["comp"] = copy_s
    return LatentTerms(envelope, per_miss)


def _prefill_tokens(block: int, workload: WorkloadSpec) -> int:
    # a shared prefix is computed (and cached) once per block, not once per sequence
    return block * (workload.prompt_len - workload.shared_prefix_len) + workload.shared_prefix_len


def _prefill_terms(choice, sz, model, hardware, workload) -> dict[str, Affine]:
    block = choice.gpu_batch_size * choice.num_gpu_batches
    s, p = workload.prompt_len, workload.shared_prefix_len
    num_tokens = _prefill_tokens(block, workload)
    hidden = block * s * sz.hidden
    new_cache = num_tokens * sz.cache_stored

    ngb = choice.num_gpu_batches
    rows = choice.gpu_batch_size * max(s - p, 1)  # a micro-batch's GEMM rows (the prefix once more)
    streamed = _streamed_weights(sz, model, num_tokens, experts_read(model, choice.expert_group, ngb, rows, num_tokens))
    ctog = Affine().add(streamed, W_CPU, W_DISK).add(hidden, H_CPU, H_DISK)
    gtoc = Affine().add(new_cache, C_CPU, C_DISK).add(hidden, H_CPU, H_DISK)
    dtoc = Affine().add(streamed, W_DISK).add(hidden, H_DISK)
    ctod = Affine().add(new_cache, C_DISK).add(hidden, H_DISK)

    gpu_flops = hardware.gpu_flops(model.dtype)
    # causal attention: the suffix queries see on average (s + p) / 2 tokens, the prefix p / 2
    attn_flops = (block * (s - p) * model.attention_flops_per_query((s + p) / 2)
                  + p * model.attention_flops_per_query(p / 2))
    gemm_flops = num_tokens * model.matmul_flops_per_token_per_layer()
    head_flops = block * model.head_flops_per_token() / model.num_layers  # last position only
    # each micro-batch runs its GEMMs on gbs * (s - p) rows (the prefix once, as one more call)
    embed_share = sz.weight_fp16 - model.weight_bytes_per_layer()
    comp_s = ngb * _call_gemm_s(choice, model, hardware, rows, gemm_flops / ngb, head_flops / ngb,
                                sz.weight_fp16, embed_share)
    comp_s += ngb * _routed_rows_delta_s(choice, model, hardware, rows)
    resident_s = _resident_delta_s(choice, model, hardware, rows, gemm_flops / ngb, sz.weight_fp16, ngb)
    comp_s += attn_flops / gpu_flops
    comp_s += _delta_rule_s(num_tokens, model, hardware, decode=False)
    comp_s += _elementwise_s(num_tokens, model, hardware)
    if choice.compress_weight and not _runs_fused_int4(choice, model, hardware, rows):
        # the layer's matrices (embeddings stay dense): once a sweep for all its micro-batches,
        # or once a call where the engine dequantizes per call (`_weight_dequant_passes`)
        passes = _weight_dequant_passes(choice, ngb, rows)
        comp_s += passes * _dequant_s(model.weight_bytes_per_layer(), model, _weight_dequant_rate(choice, hardware))
        comp_s += passes * model.matrices_per_layer(num_tokens) * hardware.gpu_dequant_matrix_s
    if choice.compress_cache:  # quantizing the new cache costs about as much as dequantizing
        comp_s += _dequant_s(num_tokens * sz.cache_fp16, model, hardware.gpu_dequant_bytes_per_s)
    comp_s += choice.num_gpu_batches * hardware.gpu_layer_overhead_s
    comp_s += ngb * _fp8_upcast_s(choice, model, hardware, model.weight_bytes_per_layer())
    comp = Affine(comp_s).add(resident_s, W_GPU)
    _cpu_experts_in_place(choice, sz, model, hardware, (ngb, rows), num_tokens, ctog, comp)

    return _layer_seconds(ctog, gtoc, dtoc, ctod, comp, hardware)


def _cpu_experts_in_place(choice, sz, model, hardware, calls_rows: tuple[int, float], num_tokens: float,
                          ctog: Affine, comp: Affine) -> None:
    """Beside a GPU, where the engine computes cpu-tier experts where they live (few tokens per
    expert, `placement.expert_compute`): their reads leave the copy and their work joins compute
    at the CPU's rates. On a CPU-only machine cpu-tier weights are used in place anyway."""
    calls, rows = calls_rows
    if (not model.num_experts or hardware.gpu_is_host
            or tokens_per_expert(model, rows) >= choice.cpu_expert_tokens):
        return
    ctog.add(-sz.experts_stored * model.expected_experts(num_tokens) / model.num_experts, W_CPU)
    comp.add(calls * cpu_experts_seconds(model, hardware, rows, sz.experts_stored), W_CPU)


def _decode_weight_dequant_s(choice, model, hardware, calls: int, rows: int, block: int) -> float:
    """A decode layer's 4-bit weight dequantization where the fused kernel does not run them: what
    the whole block touches, dequantized once, or what each call touches, once a call."""
    if not choice.compress_weight or _runs_fused_int4(choice, model, hardware, rows):
        return 0.0
    rate = _weight_dequant_rate(choice, hardware)
    if _weight_dequant_passes(choice, calls, rows) == 1:
        return (_dequant_s(model.weight_bytes_touched_per_layer(block), model, rate)
                + model.matrices_per_layer(block) * hardware.gpu_dequant_matrix_s)
    return calls * (_dequant_s(model.weight_bytes_touched_per_layer(rows), model, rate)
                    + model.matrices_per_layer(rows) * hardware.gpu_dequant_matrix_s)


def _decode_terms(choice, sz, model, hardware, workload) -> dict[str, Affine]:
    block = choice.gpu_batch_size * choice.num_gpu_batches
    context = workload.prompt_len + workload.gen_len / 2  # average over the decode steps
    entries = model.mean_attended_entries(context)  # a window layer reads its window
    hidden = block * sz.hidden
    cache_read = block * entries * sz.cache_stored  # entries attention touches, as stored
    new_cache = block * sz.cache_stored

    calls, rows = choice.decode_calls()
    read = experts_read(model, choice.expert_group, calls, rows, block)  # the experts its block routes to
    streamed = _streamed_weights(sz, model, block, read)
    cached = _cached_expert_reads(choice, sz, model, hardware, block)  # those the expert cache serves
    disk = _disk_streamed(choice, sz, model, read, streamed - cached[1])
    ctog = Affine().add(streamed - cached[0], W_CPU).add(disk, W_DISK).add(hidden, H_CPU, H_DISK)
    gtoc = Affine().add(hidden, H_CPU, H_DISK).add(new_cache, C_CPU, C_DISK)
    dtoc = Affine().add(disk, W_DISK).add(hidden, H_DISK).add(cache_read, C_DISK)
    ctod = Affine().add(hidden, H_DISK).add(new_cache, C_DISK)
    if sz.state:  # an off-gpu DeltaNet state comes to the compute device and goes back, every step
        ctog.add(block * sz.state, C_CPU, C_DISK)
        gtoc.add(block * sz.state, C_CPU, C_DISK)
    if choice.cpu_attention:  # queries go to the CPU, attention outputs come back
        gtoc.add(block * sz.query, C_CPU, C_DISK)
        ctog.add(block * sz.hidden, C_CPU, C_DISK)
    elif not choice.latent_pools:  # the off-GPU cache must come to the GPU every step (only
        ctog.add(cache_read, C_CPU, C_DISK)  # the selected entries); pools copy their misses (LatentTerms)

    gpu_flops = hardware.gpu_flops(model.dtype)
    # every call (the merged block, or each micro-batch) re-reads the whole layer and its share
    # of the head from GPU memory (an MoE call reads only the experts its tokens pick): a
    # roofline, or the measured GEMM rate at that many rows, which on CPUs falls well short of both
    embed_share = sz.weight_fp16 - model.weight_bytes_per_layer()
    touched_by_call = model.weight_bytes_touched_per_layer(rows) + embed_share
    gemm_s = calls * _call_gemm_s(choice, model, hardware, rows, rows * model.matmul_flops_per_token_per_layer(),
                                  rows * model.head_flops_per_token() / model.num_layers, touched_by_call,
                                  embed_share)
    resident_s = _resident_delta_s(choice, model, hardware, rows, rows * model.matmul_flops_per_token_per_layer(),
                                   model.weight_bytes_touched_per_layer(rows), calls)
    gemm_s += calls * (hardware.gpu_layer_overhead_s + _routed_rows_delta_s(choice, model, hardware, rows))
    gemm_s += calls * _fp8_upcast_s(choice, model, hardware, model.weight_bytes_touched_per_layer(rows))
    gemm_s += _elementwise_s(block, model, hardware)
    gemm_s += _delta_rule_s(block, model, hardware, decode=True)
    gemm_s += _decode_weight_dequant_s(choice, model, hardware, calls, rows, block)
    attn_flops = block * model.attention_flops_per_query(context)
    attn_bytes = block * (entries * sz.cache_fp16 + context * sz.indexer)
    gpu_attn_s = max(attn_flops / gpu_flops, attn_bytes / hardware.gpu_mem_bytes_per_s)
    if choice.compress_cache:
        gpu_attn_s += _dequant_s(block * entries * sz.cache_fp16, model, hardware.gpu_dequant_bytes_per_s)
    comp = Affine(gemm_s).add(resident_s, W_GPU)
    _cpu_experts_in_place(choice, sz, model, hardware, (calls, rows), block, ctog, comp)
    if choice.cpu_attention:
        cpu_attn_s = attn_flops / hardware.cpu_attention_flops_per_s
        if choice.compress_cache:
            cpu_attn_s += _dequant_s(block * entries * sz.cache_fp16, model, hardware.cpu_dequant_bytes_per_s)
        comp.add(gpu_attn_s, C_GPU).add(cpu_attn_s, C_CPU, C_DISK)
    else:
        comp.add(gpu_attn_s)

    return _layer_seconds(ctog, gtoc, dtoc, ctod, comp, hardware)


def _streamed_weights(sz: _Sizes, model: ModelSpec, num_tokens: float, experts: float) -> float:
    """Bytes of a layer (off the gpu tier) that a sweep over `num_tokens` tokens reads: all but
    the input embedding rows its tokens do not look up and the routed experts, and of those the
    expected share its tokens pick (`ModelSpec.expected_experts`:
    from the measured routing profile, else uniform; the engine fetches an expert once its router
    picked it). Priced for every off-gpu expert alike: with the hottest experts placed on the gpu
    tier the ones off it are picked less often, so this is the chord of a convex curve, an upper
    bound exact with all experts on one tier. `experts`: how many of them it reads
    (`expert_groups.experts_read`: streamed over several calls, some more than once)."""
    unread_rows = _unread_input_rows(model, num_tokens)
    if not model.num_experts:
        return sz.weight_stored - unread_rows
    return sz.weight_stored - unread_rows - sz.experts_stored * (1 - experts / model.num_experts)


def _cached_expert_reads(choice, sz: _Sizes, model: ModelSpec, hardware: HardwareSpec,
                         num_tokens: float) -> tuple[float, float]:
    """Bytes of a sweep's routed-expert reads (per unit of the cpu and of the disk fraction) the
    expert cache serves: `Choice.expert_hits` of those off disk, and beside a GPU of the copies off
    the cpu tier (never of cpu-tier experts computed where they live)."""
    if not (model.num_experts and choice.expert_hits):
        return 0.0, 0.0
    served = choice.expert_hits * sz.experts_stored * model.expected_experts(num_tokens) / model.num_experts
    copies_off_cpu = not hardware.gpu_is_host and tokens_per_expert(model, num_tokens) >= choice.cpu_expert_tokens
    return (served if copies_off_cpu else 0.0), served


def _disk_streamed(choice, sz: _Sizes, model: ModelSpec, experts: float, streamed: float) -> float:
    """Bytes a sweep reads per unit of the disk fraction: `streamed` (every kind of weight in its
    share), or with `Choice.disk_experts_only` routed experts only, each of the `experts` read as
    routed, less what the expert cache serves."""
    if not (choice.disk_experts_only and model.num_experts):
        return streamed
    return sz.weight_stored * experts / model.num_experts * (1 - choice.expert_hits)


def _unread_input_rows(model: ModelSpec, num_tokens: float) -> float:
    """The average layer's share of an untied input embedding table that a sweep over `num_tokens`
    tokens leaves unread: the engine looks up its tokens' rows only (a tied table is read whole,
    as the head). What `sz.weight_stored` counts of it beside those rows."""
    if model.tie_word_embeddings:
        return 0.0
    table = model.vocab_size * model.hidden_size * model.dtype_bytes
    return table * (1 - min(1.0, num_tokens / model.vocab_size)) / model.num_layers


def int4_runs_in_place(hardware: HardwareSpec, dtype: str) -> bool:
    """Whether `hardware` multiplies 4-bit weights in place (a fused kernel) with `dtype`
    activations: it has a rate table for that dtype (measured by the profile, or a preset's)."""
    return bool(hardware.gpu_int4_gemm_flops_by_rows.get(dtype)) and hardware.int4_dense_from_rows > 0


def _in_place_int4(choice: Choice, model: ModelSpec, rows: float) -> bool:
    """The engine's rule for a call of `rows` rows on 4-bit weights, used by time and memory
    alike: in place (the fused kernel, nothing dense held) under the engine's switch, in a
    16-bit dtype, where the machine has the kernel (`Choice.int4_kernel`)."""
    return (choice.compress_weight and choice.compression.num_bits == 4 and choice.int4_kernel
            and rows < choice.int4_in_place_below_rows and model.dtype in ("fp16", "bf16"))


def _runs_fused_int4(choice: Choice, model: ModelSpec, hardware: HardwareSpec, rows: float) -> bool:
    """Whether the engine multiplies 4-bit weights in place on calls of `rows` rows (the fused
    kernel, priced from the machine's table), rather than dequantizing them for a dense GEMM."""
    return _in_place_int4(choice, model, rows) and hardware.int4_gemm_seconds(model.dtype, rows, 1.0) is not None


def _int4_twins(choice: Choice, calls: int, rows: float) -> bool:
    """Whether the engine dequantizes a layer's 4-bit matrices once for all of a sweep's calls
    (and holds them dense meanwhile: `_dequantized_bytes`): two calls or more of at least
    `Choice.int4_in_place_below_rows` rows (the offload executor's `_reserve_int4_twins`)."""
    return (choice.compress_weight and choice.compression.num_bits == 4 and calls >= 2
            and rows >= choice.int4_in_place_below_rows)


def _weight_dequant_passes(choice: Choice, calls: int, rows: float) -> int:
    """How often a layer's compressed weights are dequantized in a sweep of `calls` calls that
    take the dense path: 4-bit matrices once a call, unless held dense for the sweep
    (`_int4_twins`); other compressions once a sweep (the engine expands them on arrival)."""
    if choice.compression.num_bits != 4 or _int4_twins(choice, calls, rows):
        return 1
    return calls


def _weight_dequant_rate(choice: Choice, hardware: HardwareSpec) -> float:
    """fp16 output bytes/s of decompressing the weights as the engine stores them."""
    return hardware.int4_dequant_bytes_per_s if choice.compression.num_bits == 4 else hardware.gpu_dequant_bytes_per_s


def _call_gemm_s(choice: Choice, model: ModelSpec, hardware: HardwareSpec, rows: float, layer_flops: float,
                 head_flops: float, weight_bytes: float, head_bytes: float) -> float:
    """Seconds of one call's GEMMs over `rows` rows: the layer's matrices (`layer_flops` over
    `weight_bytes`, the head's share included) on the dense GEMM, or on the fused 4-bit kernel
    where the engine runs that, or on int8 codes where it runs 4-bit prompts so (the head's share,
    `head_flops` over `head_bytes`, stays dense)."""
    if _runs_fused_int4(choice, model, hardware, rows):
        fused_s = hardware.int4_gemm_seconds(model.dtype, rows, layer_flops)
    elif choice.compress_weight and choice.compression.num_bits == 4 and model.dtype in ("fp16", "bf16"):
        fused_s = hardware.int4_prompt_seconds(model.dtype, rows, layer_flops)
    else:
        fused_s = None
    if fused_s is None:
        return hardware.gemm_seconds(model.dtype, rows, layer_flops + head_flops, weight_bytes)
    return fused_s + hardware.gemm_seconds(model.dtype, rows, head_flops, head_bytes)


def _routed_rows_delta_s(choice: Choice, model: ModelSpec, hardware: HardwareSpec, rows: float) -> float:
    """Seconds a call's routed-expert GEMMs take beyond their price at the call's `rows`: each
    expert multiplies only the tokens routed to it (`tokens_per_expert`: one or two in a decode
    step), where a measured GEMM runs well below its rate at the call's rows. Uncompressed weights
    (4-bit experts take the kernels' own rates)."""
    if not model.num_experts or choice.compress_weight or rows <= 0:
        return 0.0
    flops = rows * model.num_experts_per_token * expert_flops_per_token(model) * model.moe_layer_share
    own = max(tokens_per_expert(model, rows), 1.0)
    return hardware.gemm_seconds(model.dtype, own, flops, 0.0) - hardware.gemm_seconds(model.dtype, rows, flops, 0.0)


def _resident_delta_s(choice, model: ModelSpec, hardware: HardwareSpec, rows: float, flops: float,
                      weight_bytes: float, calls: int) -> float:
    """Seconds a layer's GEMMs change by (negative: saved) per unit of the weight fraction on
    the GPU tier, where the engine keeps weights resident in the GEMM's own layout; compressed
    weights are decompressed afresh every time and gain nothing. `flops`: per call of `rows`."""
    if choice.compress_weight:
        return 0.0
    resident = hardware.gemm_seconds(model.dtype, rows, flops, weight_bytes, resident=True)
    streamed = hardware.gemm_seconds(model.dtype, rows, flops, weight_bytes)
    return calls * (resident - streamed)


def _elementwise_s(num_tokens: float, model: ModelSpec, hardware: HardwareSpec) -> float:
    """Seconds of one layer's memory-bound passes (norms, rotary, activation) over `num_tokens`."""
    elements = num_tokens * model.elementwise_elements_per_token_per_layer()
    return elements * model.dtype_bytes / hardware.gpu_mem_bytes_per_s


def _delta_rule_s(num_tokens: float, model: ModelSpec, hardware: HardwareSpec, *, decode: bool) -> float:
    """Seconds of one (average) layer's gated delta rule over `num_tokens` (0 without DeltaNet
    layers): its products at the rule's rate, the passes around it at the memory's."""
    flops = num_tokens * model.delta_rule_flops_per_token_per_layer(decode)
    if not flops:
        return 0.0
    passes = num_tokens * model.delta_rule_passes_per_token_per_layer(decode) * 4 / hardware.gpu_mem_bytes_per_s
    return hardware.delta_rule_seconds("decode" if decode else "prompt", flops, LINEAR_CHUNK) + passes


def _fp8_upcast_s(choice: Choice, model: ModelSpec, hardware: HardwareSpec, stored_bytes: float) -> float:
    """Seconds one call spends upcasting the FP8 matrices it uses (`stored_bytes` of a layer as
    stored, vectors included): the engine upcasts each per call, at the dequantization rate."""
    if model.weight_format != "fp8" or choice.compress_weight:
        return 0.0
    vectors = model.vector_param_count() * model.dtype_bytes
    dense = (stored_bytes - vectors) * model.dtype_bytes / model.matrix_bytes_per_param
    return _dequant_s(dense, model, hardware.gpu_dequant_bytes_per_s)


def _dequant_s(dense_bytes: float, model: ModelSpec, fp16_bytes_per_s: float) -> float:
    """Seconds to decompress what is `dense_bytes` in the model's dtype; dequantization rates
    are counted in fp16 output bytes (2 per element) whatever the dtype."""
    return dense_bytes / model.dtype_bytes * 2 / fp16_bytes_per_s


def _cpu_decode_staging(choice, sz, model, rows: int, full_entries: float, cache_home: float) -> Affine:
    """The cpu tier's bytes for a decode call beside what is resident there: ESS's records (every
    one on the cpu tier, the pools besides), the disk tier's activations and cache staged, and with
    CPU attention its scores plus a dequantized copy of one call's cache."""
    out = Affine()
    if choice.latent_pools:
        out.add(cache_home, C_GPU)
    out.add(2 * rows * sz.hidden, H_DISK).add(2 * rows * full_entries * sz.cache_stored, C_DISK)
    if choice.cpu_attention:
        out.add(model.dtype_bytes * rows * model.num_heads * full_entries)
        if choice.compress_cache:
            out.add(rows * full_entries * sz.cache_fp16)
    return out


def _memory_rows(choice, sz, model, workload) -> dict[str, Affine]:
    """Peak bytes per tier: resident data ("home") plus working buffers for one micro-batch."""
    gbs, block = choice.gpu_batch_size, choice.gpu_batch_size * choice.num_gpu_batches
    s, n = workload.prompt_len, workload.gen_len
    layers = model.num_layers
    num_cached = block * (s + n - workload.shared_prefix_len) + workload.shared_prefix_len
    weights_home = layers * sz.weight_stored
    cache_home = layers * _held_tokens(choice, model, workload) * sz.cache_stored
    # DeltaNet states: one per sequence (and one for a shared prefix), placed by the cache fractions
    cache_home += layers * (block + (1 if workload.shared_prefix_len else 0)) * sz.state
    indexer_home = layers * num_cached * sz.indexer  # ESS: indexer keys stay on the GPU
    hidden_p, hidden_g = block * s * sz.hidden, block * sz.hidden
    full_entries = model.attended_entries(s + n)
    db = model.dtype_bytes

    def resident(hidden: float, gpu: bool) -> Affine:
        w, c, h = (W_GPU, C_GPU, H_GPU) if gpu else (W_CPU, C_CPU, H_CPU)
        return Affine().add(weights_home, w).add(cache_home, c).add(hidden, h)

    # GPU: double-buffered streamed layer weights (a layer's own: the embedding table and the
    # head are read in rows and vocab chunks, never staged whole; routed experts only as the
    # sweep's tokens can pick them, and never prefetched), the micro-batch's hidden in/out,
    # FFN/attention intermediates, compressed weights as they expand.
    def gpu_working(seqs: int, tokens_per_seq: int, calls: int) -> Affine:
        hidden_io = 2 * seqs * tokens_per_seq * sz.hidden
        staged = (2 * (sz.layer_stored - sz.experts_stored)
                  + routed_staging(sz, model, calls * seqs * tokens_per_seq, choice.expert_group))
        work = Affine(indexer_home + staged + hidden_io)
        work.add(-staged, W_GPU).add(-hidden_io, H_GPU)
        if choice.compress_weight:
            return work.add(_dequantized_bytes(choice, sz, model, seqs * tokens_per_seq, calls))
        if model.weight_format == "fp8":  # upcast per call: an absorbed matrix and one other at most
            return work.add(2 * max(o * i for o, i in model.layer_matrix_shapes()) * db)
        return work

    gpu_prefill = resident(hidden_p, True).plus(gpu_working(gbs, s, choice.num_gpu_batches))
    gpu_prefill.add(db * gbs * model.layer_workspace_elements(s, s))
    gpu_prefill.plus(_attended_cache(choice, gbs * s * sz.cache_fp16))
    # a decode call runs the merged block or one micro-batch (`Choice.decode_calls`)
    calls, rows = choice.decode_calls()
    gpu_decode = resident(hidden_g, True).plus(gpu_working(rows, 1, calls))
    gpu_decode.add(db * rows * model.layer_workspace_elements(1, full_entries))
    gpu_decode.plus(_attended_cache(choice, rows * full_entries * sz.cache_fp16))

    # CPU: staging buffers for the activations and cache that stream from disk; weights on disk
    # are read tensor by tensor straight into the gpu tier's staging (on a GPU through a
    # transient one-tensor host buffer), so they hold no layer-sized CPU buffer
    cpu_prefill = resident(hidden_p, False)
    if choice.latent_pools:  # ESS's layout: every record on the cpu tier, the pools besides
        cpu_prefill.add(cache_home, C_GPU)
    cpu_prefill.add(2 * gbs * s * sz.hidden, H_DISK).add(gbs * s * sz.cache_stored, C_DISK)
    cpu_decode = resident(hidden_g, False).plus(_cpu_decode_staging(choice, sz, model, rows, full_entries, cache_home))

    disk = Affine().add(weights_home, W_DISK).add(cache_home, C_DISK).add(hidden_p, H_DISK)
    return {"gpu_prefill": gpu_prefill, "gpu_decode": gpu_decode, "cpu_prefill": cpu_prefill,
            "cpu_decode": cpu_decode, "disk": disk}


def routed_staging(sz: _Sizes, model: ModelSpec, num_tokens: float, group: int = 0) -> float:
    """Bytes of routed experts a layer's calls over `num_tokens` tokens stage at once (every pick,
    up to all experts, or the `group` streamed, `placement.expert_groups`), before the gpu tier's
    own share."""
    return sz.experts_stored * staged_share(model, num_tokens, group)


def _held_tokens(choice: Choice, model: ModelSpec, workload: WorkloadSpec) -> float:
    """Tokens an (average) layer's cache holds for a block: each sequence's own positions and a
    shared prefix once, a window layer's last `window` of each (`ModelSpec.held_tokens`; a
    compressed cache keeps every position: the engine rings uncompressed layers only)."""
    block = choice.gpu_batch_size * choice.num_gpu_batches
    own, prefix = workload.prompt_len + workload.gen_len - workload.shared_prefix_len, workload.shared_prefix_len
    if choice.compress_cache:
        return block * own + prefix
    return block * model.held_tokens(own) + (model.held_tokens(prefix) if prefix else 0.0)


def _dequantized_bytes(choice: Choice, sz: _Sizes, model: ModelSpec, rows: int, calls: int = 1) -> float:
    """GPU bytes a layer's compressed matrices must expand to while it runs `calls` calls of
    `rows` rows each, as the offload engine does it: 4-bit matrices in fp16/bf16 multiply in
    place under `Choice.int4_in_place_below_rows` rows; from there every matrix is held dense
    for the sweep when there are several such calls (`_int4_twins`, plus one matrix's
    transient copy before it is prepacked), else one matrix is dequantized per call. Other
    compressions expand the whole layer. Without the kernel (`Choice.int4_kernel`) every
    call dequantizes."""
    if choice.compression.num_bits != 4:
        return sz.layer_matrices
    if _in_place_int4(dataclasses.replace(choice, compress_weight=True), model, rows):
        return 0.0
    largest = _largest_called_matrix(model) * model.dtype_bytes
    return sz.layer_matrices + largest if _int4_twins(choice, calls, rows) else largest


def _largest_called_matrix(model: ModelSpec) -> int:
    """Elements of the largest matrix one call multiplies: the engine stacks a LLaMA-family
    layer's q/k/v and gate/up projections into one matrix each (OPT and MLA run theirs apart)."""
    shapes = model.layer_matrix_shapes()
    if model.arch not in ("opt", "mla") and len(shapes) == 7:
        (q, h), (k, _), (v, _), o, (gate, _), (up, _), down = shapes
        shapes = [(q + k + v, h), o, (gate + up, h), down]
    return max((o * i for o, i in shapes), default=0)


def _attended_cache(choice: Choice, dense_bytes: float) -> Affine:
    """GPU bytes one call's attention holds besides the resident cache: `dense_bytes`, the
    call's cache rows uncompressed, copied in for the layers off the GPU (unless attention runs
    on the CPU) and decompressed for compressed layers on it. The engine attends one call at a
    time and fetches no cache ahead, so one copy is held, never two."""
    staged = Affine()
    if choice.latent_pools:  # the selected records, gathered from the pool, as one buffer
        return staged.add(dense_bytes)
    if not choice.cpu_attention:
        staged.add(dense_bytes, C_CPU, C_DISK)
    if choice.compress_cache:
        staged.add(dense_bytes, C_GPU)
    return staged


def _layer_seconds(ctog: Affine, gtoc: Affine, dtoc: Affine, ctod: Affine, comp: Affine,
                   hardware: HardwareSpec) -> dict[str, Affine]:
    """Per-layer terms in seconds: the four transfers' bytes over their bandwidths, and compute
    (which the tier copies join when the gpu is the host CPU: `HardwareSpec.gpu_is_host`)."""
    ctog_s = ctog.scaled(1 / hardware.cpu_to_gpu_bytes_per_s)
    gtoc_s = gtoc.scaled(1 / hardware.gpu_to_cpu_bytes_per_s)
    if hardware.gpu_is_host:
        # one memory: what the cpu tier holds is used where it is (charged, never copied); a
        # disk read's copy out of the page cache (and a write's into it) runs on the cores that
        # compute, so it joins compute and no link time is left
        comp.plus(_disk_part(ctog_s)).plus(_disk_part(gtoc_s))
        ctog_s, gtoc_s = Affine(), Affine()
    return {
        "ctog": ctog_s,
        "gtoc": gtoc_s,
        "dtoc": dtoc.scaled(1 / hardware.disk_read_bytes_per_s),
        "ctod": ctod.scaled(1 / hardware.disk_write_bytes_per_s),
        "comp": comp,
    }


def _disk_part(term: Affine) -> Affine:
    """The part of a tier copy that comes from or goes to disk (its disk fractions' terms)."""
    coef = np.zeros(NUM_FRACTIONS)
    for idx in (W_DISK, C_DISK, H_DISK):
        coef[idx] = term.coef[idx]
    return Affine(0.0, coef)
