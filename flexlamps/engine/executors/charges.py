"""What the offload executor charges its tier budgets, computed without running it.

One home for the byte counts the executor charges besides its stored weights (a layer's weight
copies as each weight's kind says, a micro-batch's workspace and staged cache rows, the peak of a
sweep on the gpu tier), over a `WeightStore`: the executor's own (to decide whether merged decode
fits, and what each layer charges) or one on paper for its dry run (`flexlamps.planning.dry_run`),
so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

import placement
from flexlamps.engine.caches.latent import is_offloaded, latent_staged_bytes
from flexlamps.engine.caches.state import state_layer_bytes
from flexlamps.engine.caches.tiered import attends_with_staged_rows, staged_rows_bytes
from flexlamps.engine.executors.placement_map import cache_tiers
from flexlamps.engine.executors.split_tables import head_chunks
from flexlamps.engine.executors.weight_store import WeightStore
from flexlamps.models.config import ModelConfig
from flexlamps.models.blocks.weight_kind import KINDS, WeightKind
from placement.cost_memory import workspace_bytes
from quant import KV_CACHE_DEFAULT
from quant.int4_weight import Int4Weight, kernel_dtypes


def kv_quant_config(policy: placement.Policy):
    """The compressed cache's layout: the policy's bits and group size along the head dim."""
    size = dict(bits=policy.compression.num_bits, group_size=policy.compression.group_size)
    return dataclasses.replace(KV_CACHE_DEFAULT, **size)


def layer_cache_tiers(cfg, split) -> list[str]:
    """Each model layer's cache tier: a hybrid model's KV layers and DeltaNet layers are each spread
    by the policy's cache fractions among themselves (as `OffloadExecutor.new_cache` builds them)."""
    if cfg.hybrid is None:
        return cache_tiers(cfg.num_layers, split)
    kv = iter(cache_tiers(len(cfg.hybrid.full_layers), split))
    state = iter(cache_tiers(len(cfg.hybrid.linear_layers), split))
    return [next(state) if cfg.hybrid.is_linear(i) else next(kv) for i in range(cfg.num_layers)]


def with_backend(policy: placement.Policy, weight_quant: str | None) -> placement.Policy:
    """The policy as run with the weight compression backend `weight_quant`: any turns
    compress_weight on."""
    return policy if weight_quant in (None, "none") else dataclasses.replace(policy, compress_weight=True)


@dataclasses.dataclass(frozen=True)
class LayerMatrices:
    """`count` weights of one layer run by `kind`, of one `shape`; `absorbed`: MLA's kv_b (held
    through the attention); `fused`: the device multiplies the kind in place for this shape."""
    kind: WeightKind
    shape: tuple[int, ...]
    absorbed: bool
    fused: bool
    count: int


class PlacementCharges:
    """The bytes a `WeightStore`'s sweeps charge, its weights placed as the executor places them
    (the executor's own store, or one on paper for the dry run: `on_paper`), and its cache's tiers.
    A step is (rows, tokens per row, attended span). `latent_fp8`: an MLA model's latent cache
    holds ESS's FP8 records, not the compute dtype's; `fused_int4`: whether the device multiplies
    4-bit weights in place in the store's dtype (default: as torch's kernels do on its device
    type; a planned GPU says it, `placement.int4_runs_in_place`); `model_spec`: the run's
    `placement.ModelSpec` (its workspace figures), described from the store's config once a run."""

    def __init__(self, store: WeightStore, *, model_spec: placement.ModelSpec, latent_fp8: bool = False,
                 fused_int4: bool | None = None):
        self.store = store
        self.cfg, self.policy, self.dtype, self.dtype_bytes = store.cfg, store.policy, store.dtype, store.dtype_bytes
        cfg, policy = self.cfg, self.policy
        self.latent_fp8 = latent_fp8  # an MLA latent cache in ESS's FP8 records (656 B for V3.2)
        if cfg.mla is not None and (policy.compress_cache or policy.cpu_attention):
            raise ValueError(f"{cfg.model_type}'s latent cache is stored as it is and attended on the gpu tier: "
                             "give a policy without compress_cache and cpu_attention (or --placement auto)")
        self.model_spec = model_spec
        self.fused_int4 = self.dtype in kernel_dtypes(store.device_type) if fused_int4 is None else fused_int4
        self.expert_staged = {j: sorted((store.staged(names) for names in by_expert.values()), reverse=True)
                              for j, by_expert in store.experts.items()}  # each expert's, largest first
        self.experts_per_token = cfg.moe.num_experts_per_token if cfg.moe is not None else 0
        self.cache_tiers = layer_cache_tiers(cfg, policy.cache)
        self.layer_matrices = self._index_layers()

    @classmethod
    def on_paper(cls, config: ModelConfig, policy: placement.Policy, dtype: torch.dtype, *,
                 model_spec: placement.ModelSpec, latent_fp8: bool = False, fused_int4: bool | None = None,
                 **store_options) -> "PlacementCharges":
        """The charges of `config`'s weights placed by `policy` in a `WeightStore` on paper
        (`store_options`: its keywords), nothing read: the dry run's."""
        return cls(WeightStore(config, policy, dtype, **store_options), latent_fp8=latent_fp8, fused_int4=fused_int4,
                   model_spec=model_spec)

    def _index_layers(self) -> list[list[LayerMatrices]]:
        """Each layer's weights grouped by the kind that runs them, shape and role, once: the
        executor asks for a sweep's peak every step, and a layer's figures read only these."""
        counts = [Counter() for _ in range(self.cfg.num_layers)]
        for spec in (s for specs in self.store.layer_specs for s in specs):
            kind = self.store.stored_kind(spec)
            if kind is not None:
                fused = self.fused_int4 and not (kind is KINDS[Int4Weight] and
                                                 self.store.stored_weights.dense_on_call(spec))
                counts[spec.layer][kind, tuple(spec.shape), spec.role == "absorbed", fused] += 1
        return [[LayerMatrices(*key, count) for key, count in layer.items()] for layer in counts]

    def staged_experts(self, layer: int, steps) -> int:
        """Most bytes a sweep over `steps` stages of layer `layer`'s routed experts at once: the
        largest of as many experts as its tokens can route to (`experts_per_token` each), or as
        its group holds (`Policy.expert_group`)."""
        sizes = self.expert_staged.get(layer, [])
        picks = sum(rows * tokens for rows, tokens, _ in steps) * self.experts_per_token
        if self.policy.expert_group:
            picks = min(picks, self.policy.expert_group)
        return sum(sizes[:picks])

    def arrival_copies(self, layer: int) -> int:
        """Bytes of a layer's weights expanded when it arrives, held for its whole run."""
        return sum(m.count * m.kind.arrival_bytes(m.shape, self.dtype_bytes) for m in self.layer_matrices[layer])

    def call_copies(self, layer: int, rows: int, *, sweep_copies: bool = False) -> int:
        """Most bytes a layer's calls of up to `rows` rows hold in copies (`WeightKind.call_bytes`):
        one call at a time, so the largest of each kind, and an absorbed matrix's (MLA's kv_b,
        upcast once for the attention while other calls run) beside them. `sweep_copies`: the
        kinds that keep a copy for the sweep (`sweep_copies`) make none a call."""
        absorbed, largest = 0, {}
        for m in self.layer_matrices[layer]:
            if sweep_copies and m.kind.sweep_bytes(m.shape, self.dtype_bytes):
                continue
            nbytes = m.kind.call_bytes(m.shape, rows, self.dtype_bytes, fused=m.fused)
            if m.absorbed:
                absorbed = max(absorbed, nbytes)
            else:
                largest[m.kind] = max(largest.get(m.kind, 0), nbytes)
        return absorbed + sum(largest.values())

    def sweep_copies(self, layer: int) -> int:
        """What the executor holds when a layer's matrices keep one dense copy each for a sweep's
        calls (`Sweep._reserve_int4_twins`): all of them, plus one matrix's transient copy
        before it is prepacked."""
        sizes = [(m.count, m.kind.sweep_bytes(m.shape, self.dtype_bytes)) for m in self.layer_matrices[layer]]
        return sum(count * nbytes for count, nbytes in sizes) + max((nbytes for _, nbytes in sizes), default=0)

    def takes_sweep_copies(self, layer: int, steps) -> bool:
        """Whether a sweep over `steps` keeps a dense copy of layer `layer`'s matrices for all its
        calls (their kind's choice, `WeightKind.keeps_sweep_copy`), when the gpu tier has room."""
        call_rows = [rows * tokens for rows, tokens, _ in steps]
        return any(m.kind.sweep_bytes(m.shape, self.dtype_bytes) and m.kind.keeps_sweep_copy(call_rows)
                   for m in self.layer_matrices[layer])

    def layer_need(self, layer: int, steps, twins: bool) -> int:
        """Gpu bytes layer `layer` holds while it runs `steps`, besides its own staged weights:
        the next layer's prefetch, its decompressed weights (with `twins`: every 4-bit matrix
        dense for the whole sweep, else one a call), and the largest micro-batch's workspace
        and staged cache rows. The executor takes twins where staged + this fits (the same rule
        as `sweep_gpu_peak`)."""
        most_rows = max((rows * tokens for rows, tokens, _ in steps), default=0)
        weights = self.arrival_copies(layer) + self.call_copies(layer, most_rows, sweep_copies=twins)
        weights += self.sweep_copies(layer) if twins else 0
        weights += self.store.staged(self.store.layer_names[layer + 1]) if layer + 1 < self.cfg.num_layers else 0
        step_peak = 0
        for rows, tokens, span in steps:
            need = workspace_bytes(self.model_spec, rows, tokens, span, self.dtype_bytes)
            step_peak = max(step_peak, need + self.staged_cache_bytes(layer, rows, tokens, span))
        return weights + step_peak

    @property
    def activation_tier(self) -> str:
        return "cpu" if self.policy.activations.cpu == 1 else "gpu"  # one tier (CAPABILITIES)

    def activation_bytes(self, steps) -> int:
        return sum(rows * tokens for rows, tokens, _ in steps) * self.cfg.hidden_size * self.dtype_bytes

    def staged_cache_bytes(self, layer: int, rows: int, tokens: int, span: int) -> int:
        """Gpu bytes layer `layer`'s cache holds for one call's rows besides its tables: an MLA
        latent cache's staged records (`latent_staged_bytes`), else a KV layer's staged rows."""
        cfg, policy = self.cfg, self.policy
        if cfg.mla is not None:
            offloaded = is_offloaded(cfg, policy.cache.gpu)
            return latent_staged_bytes(cfg, rows, tokens, span, self.dtype, offloaded=offloaded, fp8=self.latent_fp8)
        if cfg.hybrid is not None and cfg.hybrid.is_linear(layer):  # a DeltaNet layer's rows of state
            return state_layer_bytes(cfg.hybrid, rows, self.dtype) if self.cache_tiers[layer] != "gpu" else 0
        if attends_with_staged_rows(self.cache_tiers[layer], policy.cpu_attention, policy.compress_cache):
            return staged_rows_bytes(cfg, rows, span, self.dtype)
        return 0

    def sweep_gpu_peak(self, steps, room: int | None = None, logits_per_row: int = 1) -> int:
        """Most gpu bytes a sweep over `steps` holds beyond the resident weights and cache: the
        staged small global weights and the activations (when on the gpu tier) throughout,
        plus the largest of the embedding rows, a layer (its staged weights and `layer_need`)
        and the output head's vocab chunk. `room`: the gpu bytes free when the sweep starts,
        which decides where a layer's 4-bit matrices are dequantized once for the sweep
        (`takes_sweep_copies`), as the executor decides it; None: wherever the sweep wants it
        (the worst case). `logits_per_row`: positions of a row whose logits a step returns (1 when
        generating; scoring asks for every fed position, `engine.batch.scoring`)."""
        cfg, store = self.cfg, self.store
        held = store.staged(store.small_global_names)
        held += self.activation_bytes(steps) if self.activation_tier == "gpu" else 0
        row_bytes = cfg.hidden_size * self.dtype_bytes
        embed_rows_off_gpu = sum(p.num_rows for p in store.table_pieces["embed_tokens"] if p.tier != "gpu")
        moments = [min(embed_rows_off_gpu, rows * tokens) * row_bytes for rows, tokens, _ in steps]
        for j in range(cfg.num_layers):
            twins = self.takes_sweep_copies(j, steps)
            staged = store.staged(store.layer_names[j]) + self.staged_experts(j, steps)
            moment = staged + self.layer_need(j, steps, twins)
            if twins and room is not None and held + moment > room:
                moment = staged + self.layer_need(j, steps, False)
            moments.append(moment)
        chunks = [(stop - start, piece.tier)
                  for piece, start, stop in head_chunks(store.head_pieces, store.head_chunk_rows)]
        head_rows = max(n for n, _ in chunks)  # logits of the widest chunk, and the widest staged one
        head_staged = max((n for n, tier in chunks if tier != "gpu"), default=0) * row_bytes
        moments += [rows * min(tokens, logits_per_row) * head_rows * self.dtype_bytes + head_staged
                    for rows, tokens, _ in steps]
        return held + max(moments, default=0)
