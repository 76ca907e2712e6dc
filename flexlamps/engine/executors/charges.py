"""What the offload executor charges its tier budgets, computed without running it.

One home for the byte counts the executor charges (weights as stored, a micro-batch's
workspace, the peak of a sweep on the gpu tier), used by the executor itself (to decide
whether merged decode fits) and by its dry run (`flexlamps.planning.dry_run`), so the two cannot drift apart.
Weights and caches are sized on torch's meta device: no memory, the executor's own layouts.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import torch

import placement
from flexlamps.engine.caches.tiered import attends_with_staged_rows, staged_rows_bytes
from flexlamps.engine.executors.expert_weights import experts_by_layer
from flexlamps.engine.executors.placement_map import TABLE_NAMES, cache_tiers, place_weights
from flexlamps.engine.executors.split_tables import head_chunks
from flexlamps.engine.executors.stored_weights import StoredWeights
from flexlamps.models.config import ModelConfig
from flexlamps.models.blocks.linear import pack
from flexlamps.models.blocks.weight_kind import EXPANDED_ON_ARRIVAL, KINDS, WeightKind, kind_of
from flexlamps.models import description
from flexlamps.models.loading.in_place import TIED_HEAD
from flexlamps.models.weight_specs import WeightSpec
from offload import compute_device, tensor_bytes
from placement.cost_memory import HEAD_CHUNK_ROWS, workspace_bytes
from quant.fp8 import FP8, Fp8Weight
from quant.int4_weight import Int4Weight, kernel_dtypes
from quant.mxfp4 import Mxfp4Weight, mxfp4_nbytes

# a table kept as codes is cut on whole kernel tiles (`Int4Weight.rows`), a piece a head chunk
CODED_TABLE_ROWS = 64


def weight_quant_config(num_bits: int = 4):
    """Weights as the engine stores them compressed (one definition: quant.engine_weight_config)."""
    from quant import engine_weight_config

    return engine_weight_config(num_bits)


def kv_quant_config(policy: placement.Policy):
    """The compressed cache's layout: the policy's bits and group size along the head dim."""
    from quant import KV_CACHE_DEFAULT

    size = dict(bits=policy.compression.num_bits, group_size=policy.compression.group_size)
    return dataclasses.replace(KV_CACHE_DEFAULT, **size)


@functools.lru_cache(maxsize=4096)
def _stored_nbytes(shape: tuple[int, ...], dtype: torch.dtype, num_bits: int | None, prepacked: bool) -> int:
    """Bytes of one weight as the executor stores it: quantized (`num_bits`), prepacked for the
    GEMM on the gpu tier, or as read."""
    w = torch.empty(shape, dtype=dtype, device="meta")
    if num_bits is not None:
        from quant import quantize

        return tensor_bytes(*quantize(w, weight_quant_config(num_bits)).to_tensors().values())
    return tensor_bytes(pack(w) if prepacked else w)


@functools.lru_cache(maxsize=4096)
def _fp8_nbytes(shape: tuple[int, int], block: tuple[int, int], dtype: torch.dtype) -> int:
    """Bytes of an FP8 checkpoint's matrix as the executor stores it (`Fp8Weight.to_tensors`)."""
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    w = Fp8Weight(torch.empty(shape, dtype=FP8, device="meta"), torch.empty(grid, device="meta"), block, dtype)
    return tensor_bytes(*w.to_tensors().values())


def layer_cache_tiers(cfg, split) -> list[str]:
    """Each model layer's cache tier: a hybrid model's KV layers and DeltaNet layers are each spread
    by the policy's cache fractions among themselves (as `OffloadExecutor.new_cache` builds them)."""
    if cfg.hybrid is None:
        return cache_tiers(cfg.num_layers, split)
    kv = iter(cache_tiers(len(cfg.hybrid.full_layers), split))
    state = iter(cache_tiers(len(cfg.hybrid.linear_layers), split))
    return [next(state) if cfg.hybrid.is_linear(i) else next(kv) for i in range(cfg.num_layers)]


def int4_weights(policy: placement.Policy, weight_quant: str | None = None) -> bool:
    """Whether compressed weights are 4-bit `Int4Weight`s (`stored_weights`), the engine's
    form for 4-bit group-wise compression (bitsandbytes' nf4/fp4 keep their own)."""
    return (policy.compress_weight and weight_bits(policy, weight_quant) == 4
            and weight_quant in (None, "none", "groupwise4"))


# the group-wise weight compression backends (`--weight-quant`) and their bits
GROUPWISE_BACKENDS = {"groupwise4": 4, "groupwise8": 8}


def weight_bits(policy: placement.Policy, weight_quant: str | None = None) -> int:
    """Bits of the group-wise compressed weights: the backend's own, else the policy's."""
    return GROUPWISE_BACKENDS.get(weight_quant or "", policy.compression.num_bits)


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
    """A policy's placement of one model's weights and cache, as the executor makes it, and the
    bytes its sweeps charge. A step is (rows, tokens per row, attended span). `int4`: 4-bit
    weights as `Int4Weight`s (default: as the policy says); `device_type`: the compute device's
    (the stored forms depend on it; default: this machine's); `stores_fp8`: which weights an FP8
    checkpoint holds in FP8 (its reader's `stores_fp8`; default: as DeepSeek-V3 ships them);
    `latent_fp8`: an MLA model's latent cache holds ESS's FP8 records, not the compute dtype's;
    `fused_int4`: whether the device multiplies 4-bit weights in place in `dtype` (default: as
    torch's kernels do on `device_type`; a planned GPU says it, `placement.int4_runs_in_place`);
    `routing`: a MoE model's `placement.routing.RoutingProfile` (hottest experts placed first);
    `model_spec`: the run's `placement.ModelSpec` (default: `config`'s table, `models.description`);
    `weight_bits`: the compressed weights' bits (default: the policy's;
    `--weight-quant groupwise8`: 8); `in_place`: {name: a matrix in the form the checkpoint's
    blocks are kept in} (`models.loading.in_place`: a GGUF's codes; a tied head under "lm_head"),
    each stored so and charged its kind's `stored_bytes`."""

    def __init__(self, config: ModelConfig, policy: placement.Policy, dtype: torch.dtype, *,
                 int4: bool | None = None, device_type: str | None = None, stores_fp8=None,
                 latent_fp8: bool = False, fused_int4: bool | None = None, stores_mxfp4=None, routing=None,
                 model_spec: placement.ModelSpec | None = None, weight_bits: int | None = None,
                 in_place: dict | None = None):
        self.cfg = cfg = config
        self.latent_fp8 = latent_fp8  # an MLA latent cache in ESS's FP8 records (656 B for V3.2)
        if cfg.mla is not None and (policy.compress_cache or policy.cpu_attention):
            raise ValueError(f"{cfg.model_type}'s latent cache is stored as it is and attended on the gpu tier: "
                             "give a policy without compress_cache and cpu_attention (or --placement auto)")
        self.model_spec = model_spec or description.model_spec(cfg)  # the run plan's, built once
        self.policy, self.dtype = policy, dtype
        self.weight_bits = weight_bits or policy.compression.num_bits
        self.dtype_bytes = torch.empty((), dtype=dtype).element_size()
        device_type = device_type or compute_device().type
        self.fused_int4 = dtype in kernel_dtypes(device_type) if fused_int4 is None else fused_int4
        self.weights = StoredWeights(cfg, dtype, device_type,
                                     int4_weights(policy) if int4 is None else int4,
                                     cfg.storage.fp8_block, stores_fp8, cfg.storage.mxfp4,
                                     stores_mxfp4)
        self.in_place = dict(in_place or {})
        self.specs = self.weights.specs  # as stored: 4-bit q/k/v and gate/up stacked
        if TIED_HEAD in self.in_place and all(s.name != TIED_HEAD for s in self.specs):  # beside the table
            self.specs.append(WeightSpec(TIED_HEAD, next(s.shape for s in self.specs if s.name == "embed_tokens"),
                                         "embed", None))
        self.spec_named = {s.name: s for s in self.specs}
        self.placement = place_weights(cfg, policy.weights, lambda spec: self._stored_bytes(spec, "disk"), self.specs,
                                       expert_order=routing.expert_order if routing is not None else None,
                                       table_rows={name: (CODED_TABLE_ROWS, HEAD_CHUNK_ROWS) for name in TABLE_NAMES
                                                   if self.keeps_codes(name)})
        self.tiers = self.placement.tiers  # every stored tensor: each weight, each table piece
        self.stored = {s.name: self._stored_bytes(s, self.tiers[s.name]) for s in self.specs
                       if s.name not in TABLE_NAMES}
        for spec in self.specs:
            for piece in self.placement.pieces.get(spec.name, ()):
                coded = self.coded_piece(spec.name, piece)
                self.stored[piece.name] = kind_of(coded).stored_bytes(coded) if coded is not None else \
                    _stored_nbytes((piece.num_rows, *spec.shape[1:]), dtype, None, False)
        head_name = "lm_head" if "lm_head" in self.placement.pieces else "embed_tokens"
        # a head kept as codes is read a piece at a time (whole tiles); else in chunks within a piece
        coded_head = self.keeps_codes(head_name)
        self.head_chunk_rows = max([HEAD_CHUNK_ROWS] + [p.num_rows for p in self.placement.pieces[head_name]
                                                        if coded_head])
        # what a layer's fetch stages: its weights but the routed experts, fetched once routed
        experts = experts_by_layer(self.specs)
        routed = {name for by_expert in experts.values() for names in by_expert.values() for name in names}
        self.layer_specs = [[] for _ in range(cfg.num_layers)]  # each layer's weights, indexed once
        for spec in self.specs:
            if spec.layer is not None:
                self.layer_specs[spec.layer].append(spec)
        self.layer_names = [[s.name for s in specs if s.name not in routed] for specs in self.layer_specs]
        self.expert_staged = {j: sorted((self.staged(names) for names in by_expert.values()), reverse=True)
                              for j, by_expert in experts.items()}  # each expert's, largest first
        self.experts_per_token = cfg.moe.num_experts_per_token if cfg.moe is not None else 0
        self.cache_tiers = layer_cache_tiers(cfg, policy.cache)
        self.layer_matrices = self._index_layers()

    def keeps_codes(self, name: str) -> bool:
        """Whether weight `name` is stored as its checkpoint's blocks (`in_place`): not compressed
        by the policy, nor kept FP8 / MXFP4. (A table's pieces: by the table's name.)"""
        name = name.split(".rows")[0]
        spec = self.spec_named.get(name)
        return (name in self.in_place and spec is not None and not self.compressed(spec)
                and self.kept_class(spec) is None)

    def coded_piece(self, name: str, piece=None):
        """The form weight `name` (or its table piece) is stored in when kept as codes, else None."""
        if not self.keeps_codes(name):
            return None
        sample = self.in_place[name.split(".rows")[0]]
        return sample if piece is None or piece.num_rows == sample.shape[0] else sample.rows(piece.start, piece.stop)

    def compressed(self, spec) -> bool:
        """Compressed by the policy: every matrix but an MXFP4 checkpoint's, which is 4-bit
        already (quantizing its dequantized values again would add error and save nothing)."""
        return self.policy.compress_weight and spec.role == "linear" and not self.weights.is_mxfp4(spec)

    def is_fp8(self, spec) -> bool:
        """Kept in FP8 as its checkpoint stores it (compression, when asked, comes first)."""
        return not self.compressed(spec) and self.weights.is_fp8(spec)

    def is_mxfp4(self, spec) -> bool:
        """Kept in MXFP4 as its checkpoint stores it, with or without compression."""
        return self.weights.is_mxfp4(spec)

    def kept_class(self, spec) -> type | None:
        """The class of a weight kept as its checkpoint stores it (FP8 or MXFP4), else None."""
        return Fp8Weight if self.is_fp8(spec) else Mxfp4Weight if self.is_mxfp4(spec) else None

    def _stored_bytes(self, spec, tier: str) -> int:
        """Bytes of a weight as stored on `tier` (off the gpu tier: what the split shares out)."""
        if self.compressed(spec) and self.weights.is_int4(spec):
            return self.weights.int4_nbytes(spec, tier)
        if self.keeps_codes(spec.name):
            return kind_of(self.in_place[spec.name]).stored_bytes(self.in_place[spec.name])
        if self.is_fp8(spec):
            return _fp8_nbytes(tuple(spec.shape), self.weights.fp8_block, self.dtype)
        if self.is_mxfp4(spec):
            return mxfp4_nbytes(tuple(spec.shape))
        prepacked = tier == "gpu" and spec.role == "linear" and spec.layer is not None and not self.compressed(spec)
        return _stored_nbytes(tuple(spec.shape), self.dtype,
                              self.weight_bits if self.compressed(spec) else None, prepacked)

    def staged(self, names) -> int:
        """Bytes a fetch of `names` stages on the gpu tier (those not resident there)."""
        return sum(self.stored[n] for n in names if self.tiers[n] != "gpu")

    def staged_experts(self, layer: int, steps) -> int:
        """Most bytes a sweep over `steps` stages of layer `layer`'s routed experts at once: the
        largest of as many experts as its tokens can route to (`experts_per_token` each), or as
        its group holds (`Policy.expert_group`)."""
        sizes = self.expert_staged.get(layer, [])
        picks = sum(rows * tokens for rows, tokens, _ in steps) * self.experts_per_token
        if self.policy.expert_group:
            picks = min(picks, self.policy.expert_group)
        return sum(sizes[:picks])

    def _index_layers(self) -> list[list[LayerMatrices]]:
        """Each layer's weights grouped by the kind that runs them, shape and role, once: the
        executor asks for a sweep's peak every step, and a layer's figures read only these."""
        counts = [Counter() for _ in range(self.cfg.num_layers)]
        for spec in (s for specs in self.layer_specs for s in specs):
            kind = self.stored_kind(spec)
            if kind is not None:
                fused = self.fused_int4 and not (kind is KINDS[Int4Weight] and self.weights.dense_on_call(spec))
                counts[spec.layer][kind, tuple(spec.shape), spec.role == "absorbed", fused] += 1
        return [[LayerMatrices(*key, count) for key, count in layer.items()] for layer in counts]

    def stored_kind(self, spec) -> WeightKind | None:
        """The kind that runs weight `spec` in the form stored (`weight_kind`); None: a GGUF's
        blocks kept as codes, charged as stored only (a call's copy of them lives in the thread's
        reused buffer, `dense_scratch`, as in the in-memory engine)."""
        if self.compressed(spec):
            return KINDS[Int4Weight] if self.weights.is_int4(spec) else EXPANDED_ON_ARRIVAL
        if self.keeps_codes(spec.name):
            return None
        kept = self.kept_class(spec)
        return KINDS[kept] if kept is not None else KINDS[torch.Tensor]

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
        weights += self.staged(self.layer_names[layer + 1]) if layer + 1 < self.cfg.num_layers else 0
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
            from flexlamps.engine.caches.latent import is_offloaded, latent_staged_bytes

            offloaded = is_offloaded(cfg, policy.cache.gpu)
            return latent_staged_bytes(cfg, rows, tokens, span, self.dtype, offloaded=offloaded, fp8=self.latent_fp8)
        if cfg.hybrid is not None and cfg.hybrid.is_linear(layer):  # a DeltaNet layer's rows of state
            from flexlamps.engine.caches.state import state_layer_bytes

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
        cfg = self.cfg
        globals_ = [s.name for s in self.specs if s.layer is None and s.name not in TABLE_NAMES]
        held = self.staged(globals_)
        held += self.activation_bytes(steps) if self.activation_tier == "gpu" else 0
        row_bytes = cfg.hidden_size * self.dtype_bytes
        embed_rows_off_gpu = sum(p.num_rows for p in self.placement.pieces["embed_tokens"] if p.tier != "gpu")
        moments = [min(embed_rows_off_gpu, rows * tokens) * row_bytes for rows, tokens, _ in steps]
        for j in range(cfg.num_layers):
            twins = self.takes_sweep_copies(j, steps)
            staged = self.staged(self.layer_names[j]) + self.staged_experts(j, steps)
            moment = staged + self.layer_need(j, steps, twins)
            if twins and room is not None and held + moment > room:
                moment = staged + self.layer_need(j, steps, False)
            moments.append(moment)
        head = self.placement.pieces.get("lm_head") or self.placement.pieces["embed_tokens"]
        chunks = [(stop - start, piece.tier) for piece, start, stop in head_chunks(head, self.head_chunk_rows)]
        head_rows = max(n for n, _ in chunks)  # logits of the widest chunk, and the widest staged one
        head_staged = max((n for n, tier in chunks if tier != "gpu"), default=0) * row_bytes
        moments += [rows * min(tokens, logits_per_row) * head_rows * self.dtype_bytes + head_staged
                    for rows, tokens, _ in steps]
        return held + max(moments, default=0)
