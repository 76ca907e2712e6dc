"""The offload executor: weights and KV cache spread over gpu / cpu / disk as a `Policy` says,
run in FlexGen's zig-zag order: a `WeightStore` (the placement and the weights in their stored forms:
the same store its dry run keeps on paper), the `PlacementCharges` over it, and a `Sweep` that runs
micro-batches layer by layer over it.

Results equal the in-memory executor's exactly (same ops on the same values): 4-bit weights stay
4-bit on every tier and are multiplied as the in-memory engine multiplies the same `Int4Weight`s
(`stored_weights`), a GGUF's quantized matrices stay the file's blocks as the in-memory engine
keeps them (`models.loading.in_place`: the same kinds, the same kernels, the same bits), an FP8
checkpoint's matrices stay FP8 and are upcast per call as it upcasts them; a compressed cache is
within its quantization error.
"""

from __future__ import annotations

import torch

import placement
from flexlamps.cache_folder import default_offload_dir
from flexlamps.engine.caches.hybrid import HybridCache, kv_view
from flexlamps.engine.caches.latent import new_latent_cache
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.engine.caches.paged_state import HybridPagedCache
from flexlamps.engine.caches.state import StateCache
from flexlamps.engine.caches.tiered import TieredKVCache
from flexlamps.engine.executors.charges import PlacementCharges, kv_quant_config, with_backend
from flexlamps.engine.executors.contract import TierUse
from flexlamps.engine.executors.placement_map import cache_tiers
from flexlamps.engine.executors.step import Step
from flexlamps.engine.executors.stored_weights import GROUPWISE_BACKENDS, int4_weights, weight_bits, weight_quant_config
from flexlamps.engine.executors.sweep import Sweep
from flexlamps.engine.executors.weight_store import WeightStore, in_place_coded
from flexlamps.engine.routing_profile import cached_routing
from flexlamps.models.blocks.linear import KINDS
from flexlamps.models.forward import forward_for
from offload import TierBudget, compute_device
from quant import get_weight_quantizer
from quant.int4_weight import Int4Weight


# What this executor runs exactly as planned: a KV cache on any tier (an MLA latent cache or a
# DeltaNet state off disk: `placement.search.fraction_highs`), activations off disk, on one tier,
# decode merged or per micro-batch. `placement.solve` plans for this by default (a test keeps
# placement's default equal to it).
CAPABILITIES = placement.EngineCapabilities(
    cache_on_disk=True, activations_on_disk=False, split_activations=False, merged_decode=True,
    per_micro_batch_decode=True, cpu_attention=True, weight_compression=True, cache_compression=True,
    int4_in_place_below_rows=KINDS[Int4Weight].dense_from_rows)  # the 4-bit kind's rule (`CodesKind.call_bytes`)


def unsupported(policy, cfg) -> list[str]:
    """What in `policy` this executor would not run as planned: CAPABILITIES', and a cache it keeps
    in memory put on disk (an MLA latent cache, a DeltaNet state). The dry run asks the same."""
    problems = CAPABILITIES.unsupported(policy)
    if policy.cache.disk > 0 and cfg is not None and (cfg.mla is not None or cfg.hybrid is not None):
        problems.append("an MLA latent cache or a DeltaNet state on disk")
    return problems


class OffloadExecutor:
    def __init__(self, reader, policy, *, model_spec: placement.ModelSpec, gpu_mem: int, cpu_mem: int,
                 offload_dir=None, dtype: torch.dtype = torch.float32, device: torch.device | None = None,
                 verify_disk: bool = True,
                 weight_quant: str | None = None, overlap_latent_misses: bool = False,
                 latent_fp8: bool = False, expert_cache: str = "cyclic", routing=None):
        """`overlap_latent_misses`: an offloaded MLA latent cache copies each decode step's
        misses while attending over its hits (`caches.latent_copy`; within fp32 rounding of the
        exact mode, which copies, then attends, and equals the in-memory path bit for bit).
        `latent_fp8`: an MLA latent cache stores ESS's FP8 records (656 B a token and layer for
        DeepSeek-V3.2, `quant.fp8.LatentRecords`) instead of the compute dtype's values.
        `expert_cache`: which experts read off the cpu/disk tiers stay in the gpu tier's free
        room ("cyclic", "lru", "frequency" or "off"; `expert_weights.ExpertCache`). `routing`: a MoE
        model's `placement.routing.RoutingProfile`, hottest experts on the fastest tier
        (default: the one `flexlamps profile --prompts` cached for this checkpoint, if any).
        `model_spec`: the run's `placement.ModelSpec`, the one description the planner sized (a run
        plan's `plan.model`; without a plan, `models.description.model_spec(reader.config)`)."""
        if problems := unsupported(policy, getattr(reader, "config", None)):
            raise ValueError(f"the offload engine cannot run this policy as planned ({'; '.join(problems)}); "
                             "use --placement auto or a policy from `flexlamps plan`")
        self.cfg = cfg = reader.config
        if (model_spec.num_layers, model_spec.hidden_size) != (cfg.num_layers, cfg.hidden_size):
            raise ValueError(f"model_spec describes another model ({model_spec.num_layers} layers of "
                             f"{model_spec.hidden_size}, the checkpoint {cfg.num_layers} of {cfg.hidden_size}): "
                             "pass the reader's, models.description.model_spec(reader.config)")
        self.dtype = dtype
        self.policy = policy
        self.overlap_latent_misses = overlap_latent_misses
        self.device = device or compute_device()
        self.fwd = forward_for(cfg)
        self.budgets = {"gpu": TierBudget("gpu", gpu_mem), "cpu": TierBudget("cpu", cpu_mem)}
        self.qcfg = self.kv_qcfg = None
        if policy.compress_weight or policy.compress_cache:
            self.qcfg = weight_quant_config(policy.compression.num_bits)  # groups along the input channels
            self.kv_qcfg = kv_quant_config(policy)
        self.policy = policy = self._weight_backend(policy, weight_quant)
        # the store placed on paper as the dry run places it (tables cut by vocab rows into pieces,
        # one a tier; 4-bit weights Int4Weights, stacked where the forward stacks them), what its
        # sweeps charge (whether merged decode fits), then the checkpoint written into it
        int4 = bool(int4_weights(policy, weight_quant))
        if routing is None:
            routing = cached_routing(reader)
        in_place, coded = in_place_coded(reader, dtype)
        self.weights = WeightStore(cfg, policy, dtype, int4=int4, device_type=self.device.type,
                                   stores_fp8=getattr(reader, "stores_fp8", None),
                                   stores_mxfp4=getattr(reader, "stores_mxfp4", None), routing=routing,
                                   weight_bits=weight_bits(policy, weight_quant), in_place=coded)
        self.model_spec = model_spec
        self.charges = PlacementCharges(self.weights, model_spec=self.model_spec, latent_fp8=latent_fp8)
        self.weights.write(reader, self.budgets, self.device, in_place=in_place, qcfg=self.qcfg,
                           weight_quantizer=self.weight_quantizer, offload_dir=offload_dir, verify_disk=verify_disk,
                           expert_cache=expert_cache)
        self.sweep = Sweep(self.weights, self.charges, self.fwd, self.budgets, self.device)
        self.cache_disk_folder = offload_dir or default_offload_dir()  # disk-tier cache layers' (caches.disk_rows)
        # what callers read of the placement and the store (the WeightStore owns them)
        w = self.weights
        self.store, self.tiers, self.table_pieces, self.specs = w.store, w.tiers, w.table_pieces, w.specs
        self.stored_weights, self.head_pieces, self.layer_names = w.stored_weights, w.head_pieces, w.layer_names
        self.experts, self.expert_cache, self.cpu_expert_reads = w.experts, w.expert_cache, w.cpu_expert_reads
        self.reused_disk, self.max_layer_bytes, self.copies = w.reused_disk, w.max_layer_bytes, w.copies

    # -- setup ------------------------------------------------------------------------------
    def _weight_backend(self, policy, weight_quant: str | None):
        """The policy as run with the weight compression backend: group-wise (FlexGen's, any
        tier) or bitsandbytes nf4/fp4; either one turns compress_weight on."""
        self.weight_quantizer = None
        if weight_quant in (None, "none"):
            return policy
        if weight_quant in GROUPWISE_BACKENDS:
            self.qcfg = weight_quant_config(GROUPWISE_BACKENDS[weight_quant])
        else:
            self.weight_quantizer = get_weight_quantizer(weight_quant)
        return with_backend(policy, weight_quant)

    def new_cache(self, num_slots: int, capacity: int) -> TieredKVCache:
        if self.cfg.hybrid is not None:
            return self._hybrid_cache(num_slots, capacity)
        if self.cfg.mla is not None:
            return new_latent_cache(self.cfg, num_slots, capacity, self.dtype, gpu_fraction=self.policy.cache.gpu,
                                    budgets=self.budgets, device=self.device, layer_fractions=self.policy.latent_pools,
                                    overlap_misses=self.overlap_latent_misses, fp8=self.charges.latent_fp8)
        return TieredKVCache(self.cfg, num_slots, capacity, self.dtype, cache_tiers(self.cfg.num_layers, self.policy.cache),
                             self.budgets, self.device, cpu_attention=self.policy.cpu_attention,
                             compress=self.kv_qcfg if self.policy.compress_cache else None,
                             disk_folder=self.cache_disk_folder)

    def _hybrid_cache(self, num_slots: int, capacity: int):
        """A hybrid model's KV cache over its full-attention layers and recurrent state for its
        DeltaNet layers, each spread over the tiers by the policy's cache fractions."""
        cfg, split = self.cfg, self.policy.cache
        kv_cfg = kv_view(cfg)
        kv = TieredKVCache(kv_cfg, num_slots, capacity, self.dtype, cache_tiers(kv_cfg.num_layers, split),
                           self.budgets, self.device, cpu_attention=self.policy.cpu_attention,
                           compress=self.kv_qcfg if self.policy.compress_cache else None,
                           disk_folder=self.cache_disk_folder)
        try:
            state = StateCache(cfg.hybrid, num_slots, self.dtype, cache_tiers(len(cfg.hybrid.linear_layers), split),
                               self.device, self.budgets)
        except BaseException:
            kv.release()
            raise
        return HybridCache(cfg, kv, state)

    def new_paged_cache(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> PagedKVCache:
        """KV blocks on the gpu tier (attention runs there) and a swap pool on the cpu tier,
        both charged to this executor's budgets."""
        if self.cfg.hybrid is not None:  # KV blocks and each request's DeltaNet state in one pool
            return HybridPagedCache(self.cfg, num_gpu_blocks, num_cpu_blocks, block_size, self.dtype, self.device,
                                    budgets=self.budgets)
        return PagedKVCache(self.cfg, num_gpu_blocks, num_cpu_blocks, block_size, self.dtype, self.device,
                            budgets=self.budgets)

    def tier_use(self) -> dict[str, TierUse]:
        return {tier: TierUse(b.used_bytes, b.peak_bytes, b.capacity_bytes) for tier, b in self.budgets.items()}

    def planned_sweep_gpu_bytes(self, step_shapes) -> int:
        return self.charges.sweep_gpu_peak(list(step_shapes))

    def reset_peaks(self) -> None:
        for budget in self.budgets.values():
            budget.reset_peak()

    def forward_steps(self, cache: TieredKVCache, steps: list[Step]) -> list[torch.Tensor]:
        """Run the micro-batches in one sweep (`Sweep.forward_steps`)."""
        return self.sweep.forward_steps(cache, steps)

    def close(self) -> None:
        self.weights.close()
