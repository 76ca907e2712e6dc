"""The offload executor: weights and KV cache spread over gpu / cpu / disk as a `Policy` says,
run in FlexGen's zig-zag order.

One call runs a list of micro-batches (prefills and decodes mixed) through the model layer by
layer: while layer j computes on every micro-batch, layer j+1's weights load on a worker
thread, so each layer's I/O is paid once per sweep for the whole block and hidden behind
compute. Results equal the in-memory executor's exactly (same ops on the same values):
4-bit weights stay 4-bit on every tier and are multiplied as the in-memory engine multiplies
the same `Int4Weight`s (`stored_weights`), a GGUF's quantized matrices stay the file's blocks as
the in-memory engine keeps them (`models.loading.in_place`: the same kinds, the same kernels, the
same bits), an FP8 checkpoint's matrices stay FP8 and are upcast per call as it upcasts them; a
compressed cache is within its quantization error.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

import placement
from flexlamps import fault_points
from flexlamps.cache_folder import default_offload_dir
from flexlamps.engine.caches.paged import PagedKVCache
from flexlamps.engine.caches.tiered import TieredKVCache
from flexlamps.engine.executors.charges import (GROUPWISE_BACKENDS, HEAD_CHUNK_ROWS, PlacementCharges,
                                                int4_weights, kv_quant_config, weight_bits, weight_quant_config,
                                                with_backend, workspace_bytes)
from flexlamps.engine.executors.contract import TierUse
from flexlamps.engine.executors.placement_map import TABLE_NAMES, cache_tiers
from flexlamps.engine.executors.split_tables import HeadReads, gather_rows, head_chunks
from flexlamps.engine.executors.copy_stream import CopyStream
from flexlamps.engine.executors.expert_weights import ExpertCache, RoutedExpertLoads, experts_by_layer
from flexlamps.engine.executors.step import Step
from flexlamps.engine.executors.stored_weights import int4_format_tag
from flexlamps.models.blocks.weight_kind import KINDS
from flexlamps.models.forward import forward_for
from flexlamps.models.loading.in_place import in_place_form, in_place_sample, in_place_specs, packs_five_bit
from flexlamps.models.weight_specs import weight_specs
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS, Int4Twin, as_logits_head, linear, pack
from offload import DiskFolder, TierBudget, TieredStore, compute_device, tensor_bytes
from offload.store import stored_parts
from quant import QTensor
from quant.fp8 import Fp8Weight
from quant.int4_weight import Int4Weight


@dataclass
class SweepProfile:
    """Per layer: wall time, time spent waiting for its weights, compute time, and how long its
    weight load took on the I/O thread. Perfect overlap makes wall == max(io, compute).
    `sweep_s`: the whole sweep, embeddings and output head included; `prefill`: it had a prompt."""
    sweep_s: float = 0.0
    prefill: bool = False
    layer_s: list[float] = field(default_factory=list)
    io_wait_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    io_s: list[float] = field(default_factory=list)


# What this executor runs exactly as planned: a KV cache on any tier (an MLA latent cache or a
# DeltaNet state off disk: `placement.search.fraction_highs`), activations off disk, on one tier,
# decode merged or per micro-batch. `placement.solve` plans for this by default (a test keeps
# placement's default equal to it).
CAPABILITIES = placement.EngineCapabilities(
    cache_on_disk=True, activations_on_disk=False, split_activations=False, merged_decode=True,
    per_micro_batch_decode=True, cpu_attention=True, weight_compression=True, cache_compression=True,
    int4_in_place_below_rows=INT4_DENSE_FROM_ROWS)


def _unsupported(policy, cfg) -> list[str]:
    """What in `policy` this executor would not run as planned: CAPABILITIES', and a cache it keeps
    in memory put on disk (an MLA latent cache, a DeltaNet state)."""
    problems = CAPABILITIES.unsupported(policy)
    if policy.cache.disk > 0 and cfg is not None and (cfg.mla is not None or cfg.hybrid is not None):
        problems.append("an MLA latent cache or a DeltaNet state on disk")
    return problems


# part of an offload folder's fingerprint when FP8 matrices are kept FP8 (`Fp8Weight.to_tensors`)
FP8_FORMAT = "fp8-v1"
MXFP4_FORMAT = "mxfp4-v1"  # the same for MXFP4 matrices (`Mxfp4Weight.to_tensors`)
IN_PLACE_FORMAT = "blocks-v1"  # the same for a GGUF's blocks kept as codes (`models.loading.in_place`)


def _bytes_per(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class OffloadExecutor:
    def __init__(self, reader, policy, *, gpu_mem: int, cpu_mem: int, offload_dir=None,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None, verify_disk: bool = True,
                 weight_quant: str | None = None, overlap_latent_misses: bool = False,
                 latent_fp8: bool = False, expert_cache: str = "cyclic", routing=None, model_spec=None):
        """`overlap_latent_misses`: an offloaded MLA latent cache copies each decode step's
        misses while attending over its hits (`caches.latent_copy`; within fp32 rounding of the
        exact mode, which copies, then attends, and equals the in-memory path bit for bit).
        `latent_fp8`: an MLA latent cache stores ESS's FP8 records (656 B a token and layer for
        DeepSeek-V3.2, `quant.fp8.LatentRecords`) instead of the compute dtype's values.
        `expert_cache`: which experts read off the cpu/disk tiers stay in the gpu tier's free
        room ("cyclic", "lru", "frequency" or "off"; `expert_weights.ExpertCache`). `routing`: a MoE
        model's `placement.routing.RoutingProfile`, hottest experts on the fastest tier
        (default: the one `flexlamps profile --prompts` cached for this checkpoint, if any).
        `model_spec`: the run's `placement.ModelSpec` (the run plan's; default: built from the config)."""
        if unsupported := _unsupported(policy, getattr(reader, "config", None)):
            raise ValueError(f"the offload engine cannot run this policy as planned ({'; '.join(unsupported)}); "
                             "use --placement auto or a policy from `flexlamps plan`")
        self.cfg = cfg = reader.config
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
        # the placement and what a sweep charges, computed ahead (whether merged decode fits);
        # the dry run's counts. Tables are cut by vocab rows into pieces, one a tier. 4-bit
        # weights are Int4Weights, stacked where the forward stacks them (`stored_weights`).
        int4 = bool(int4_weights(policy, weight_quant))
        if routing is None:
            from flexlamps.engine.routing_profile import cached_routing

            routing = cached_routing(reader)
        self.routing_counter = None  # a RoutingCounter told every MoE layer's routing, when set
        self.charges = PlacementCharges(reader.hf_config, policy, dtype, int4=int4, device_type=self.device.type,
                                        stores_fp8=getattr(reader, "stores_fp8", None), latent_fp8=latent_fp8,
                                        stores_mxfp4=getattr(reader, "stores_mxfp4", None), routing=routing,
                                        model_spec=model_spec, weight_bits=weight_bits(policy, weight_quant),
                                        config=cfg, in_place=self._in_place_samples(reader))
        self.model_spec = self.charges.model_spec
        self.stored_weights, self.specs = self.charges.weights, self.charges.specs
        self.placement = self.charges.placement
        self.tiers, self.table_pieces = self.placement.tiers, self.placement.pieces
        disk = self._disk_folder(reader, offload_dir, int4) if "disk" in self.tiers.values() else None
        self.cache_disk_folder = offload_dir or default_offload_dir()  # disk-tier cache layers' (caches.disk_rows)
        self.store = TieredStore(self.budgets, disk, self.device)
        self.copies = CopyStream(self.device)  # on CUDA: weight loads on a copy stream, joined by events
        self.reused_disk = False
        try:
            self._place_weights(reader, disk, verify_disk)
        except BaseException:
            self.store.close()  # frees the worker threads and the offload folder's lock
            raise
        self._index_weights(expert_cache)
        self.record_profile = False  # when True, every sweep appends a SweepProfile to self.sweeps
        self.sweeps: list[SweepProfile] = []

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
            from quant import get_weight_quantizer

            self.weight_quantizer = get_weight_quantizer(weight_quant)
        return with_backend(policy, weight_quant)

    def _in_place_samples(self, reader) -> dict:
        """{name: a matrix in the form kept} of the file's blocks kept as codes (sizes, layouts):
        those the in-memory executor keeps so (`self.in_place`: {name: the file tensor's spec})."""
        self.in_place = in_place_specs(reader, weight_specs(self.cfg), self.dtype)
        return {name: in_place_sample(reader, spec, self.dtype) for name, spec in self.in_place.items()}

    def _index_weights(self, expert_cache: str) -> None:
        """Which weights a sweep reads where: globals, each layer's own, its routed experts."""
        # the embedding table and output head are read in parts (rows looked up, head in vocab
        # chunks), so they never have to be staged whole on the gpu tier
        self.small_global_names = [s.name for s in self.specs if s.layer is None and s.name not in TABLE_NAMES]
        self.head_pieces = self.table_pieces.get("lm_head") or self.table_pieces["embed_tokens"]
        # a layer's routed experts are fetched when its router has picked them (`expert_weights`)
        self.experts = experts_by_layer(self.specs)
        self.expert_cache = ExpertCache(self.budgets["gpu"], expert_cache, self.cfg.num_layers)
        self.cpu_expert_reads = Counter()  # cpu-tier experts read "in place" or "staged" (`RoutedExpertLoads`)
        routed = {name for experts in self.experts.values() for names in experts.values() for name in names}
        layers = range(self.cfg.num_layers)
        self.layer_names = [[s.name for s in self.specs if s.layer == i and s.name not in routed] for i in layers]
        in_place = ("gpu", "cpu") if self.device.type == "cpu" else ("gpu",)  # tiers fetched without a copy
        self._copies_for = [any(self.store.tier_of(n) not in in_place for n in names) for names in self.layer_names]
        self.local = {s.name: s.local_name for s in self.specs}
        per_layer = [sum(s.numel for s in self.specs if s.layer == i) for i in layers]
        self.max_layer_bytes = max(per_layer, default=0) * _bytes_per(self.dtype)

    def _disk_folder(self, reader, offload_dir, int4: bool) -> DiskFolder:
        offload_dir = default_offload_dir() if offload_dir is None else offload_dir
        # the folder's contents depend on the model, the dtype, the weight split and compression
        # (and the form 4-bit weights are written in: another form is rebuilt, never read)
        policy = self.policy
        owner = f"{reader.fingerprint()}|{self.dtype}|{policy.weights!r}|{policy.compress_weight}|{self.qcfg!r}"
        coded = any(self.charges.keeps_codes(s.name) for s in self.specs)
        owner += f"|{int4_format_tag(self.device)}" if int4 or coded else ""
        owner += f"|{IN_PLACE_FORMAT}|five-bit {packs_five_bit()}" if coded else ""
        owner += f"|{FP8_FORMAT}" if any(map(self.charges.is_fp8, self.specs)) else ""
        owner += f"|{MXFP4_FORMAT}" if any(map(self.charges.is_mxfp4, self.specs)) else ""
        return DiskFolder(offload_dir, fingerprint=_stable_hash(owner))

    def _compressible(self, spec) -> bool:
        return self.charges.compressed(spec)

    def _place_weights(self, reader, disk: DiskFolder | None, verify: bool) -> None:
        skip = set()  # stored tensors already in a reused offload folder
        if disk is not None:
            disk_names = [name for name, tier in self.tiers.items() if tier == "disk"]
            names = self._disk_part_names(disk_names)
            disk.claim()
            self.reused_disk = disk.try_reuse(names, verify=verify)
            disk.check_room(sum(self.charges.stored[n] for n in disk_names), self.reused_disk)
            if not self.reused_disk:
                disk.clear()
                disk.begin(names)
            skip = set(disk_names) if self.reused_disk else set()
        for spec in self.specs:
            self._store_weight(reader, spec, skip)
            fault_points.reached("weight_stored")
        if disk is not None and not self.reused_disk:
            disk.commit()

    def _store_weight(self, reader, spec, skip: set[str]) -> None:
        """Put one weight's pieces on their tiers (those in `skip` adopted from the reused folder)."""
        pieces = self.placement.pieces_of(spec)
        for piece in pieces:
            if piece.name in skip:
                self.store.adopt_disk(piece.name, self._stored_class(spec))
        todo = [piece for piece in pieces if piece.name not in skip]
        if todo and self.charges.keeps_codes(spec.name):  # the file's blocks, as the in-memory engine keeps them
            w = in_place_form(reader, self.in_place[spec.name], self.dtype)
            for piece in todo:
                self.store.put(piece.name, w if len(pieces) == 1 else w.rows(piece.start, piece.stop), piece.tier)
            return
        if todo and self._is_int4(spec):  # a matrix: one piece
            self.store.put(spec.name, self.stored_weights.read_int4(reader, spec, todo[0].tier, self.device),
                           todo[0].tier)
            return
        kept = self.charges.kept_class(spec) if todo else None
        if kept is not None:  # a matrix: one piece, kept as the checkpoint has it (FP8, MXFP4)
            read = reader.read_fp8 if kept is Fp8Weight else reader.read_mxfp4
            self.store.put(spec.name, read(spec, self.dtype), todo[0].tier)
            return
        w = self.stored_weights.read_dense(reader, spec) if todo else None
        for piece in todo:  # a table's pieces are copies: the whole table is not kept alive
            part = w if len(pieces) == 1 else w[piece.start:piece.stop].clone()
            self.store.put(piece.name, self._stored_form(spec, part, piece.tier), piece.tier)

    def _is_int4(self, spec) -> bool:
        return self._compressible(spec) and self.stored_weights.is_int4(spec)

    def _stored_class(self, spec) -> type | None:
        """What a weight was stored as, when compressed or FP8 (to rebuild it from its parts)."""
        if self.charges.kept_class(spec) is not None:
            return self.charges.kept_class(spec)
        if self.charges.keeps_codes(spec.name):
            return type(self.charges.in_place[spec.name])
        if not self._compressible(spec):
            return None
        return Int4Weight if self._is_int4(spec) else QTensor

    def _stored_form(self, spec, w: torch.Tensor, tier: str):
        """A weight as the store keeps it: compressed, prepacked for the GEMM, or as read."""
        if self._compressible(spec) and self.weight_quantizer is not None:
            return self.weight_quantizer.quantize(w)
        if self._compressible(spec):
            from quant import quantize

            return quantize(w, self.qcfg)
        if tier == "gpu" and spec.role == "linear" and spec.layer is not None and self.device.type == "cpu":
            return pack(w)  # resident for the whole run: prepacked once for oneDNN (the planner prices it so)
        return w

    def _disk_part_names(self, disk_names) -> set[str]:
        names = set()
        compressible = {s.name: s for s in self.specs if self._compressible(s)}
        kept = {s.name: self.charges.kept_class(s) for s in self.specs if self.charges.kept_class(s)}
        for name in disk_names:
            coded = self.charges.coded_piece(name, self._piece_named(name))
            if coded is not None:
                names |= set(stored_parts(coded, name + "::"))
            elif name in compressible and self._is_int4(compressible[name]):
                names |= set(self.stored_weights.int4_part_names(compressible[name], "disk"))
            elif name in compressible:
                names |= {f"{name}::codes", f"{name}::scales", f"{name}::meta", f"{name}::mins"}
            elif name in kept:
                names |= set(kept[name].part_names(f"{name}::"))
            else:
                names.add(name)
        return names

    def _piece_named(self, name: str):
        """The table piece stored as `name`, or None (a whole weight)."""
        return next((p for pieces in self.table_pieces.values() for p in pieces if p.name == name), None)

    def new_cache(self, num_slots: int, capacity: int) -> TieredKVCache:
        if self.cfg.hybrid is not None:
            return self._hybrid_cache(num_slots, capacity)
        if self.cfg.mla is not None:
            from flexlamps.engine.caches.latent import new_latent_cache

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
        from flexlamps.engine.caches.hybrid import HybridCache, kv_view
        from flexlamps.engine.caches.state import StateCache

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
            from flexlamps.engine.caches.paged_state import HybridPagedCache

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

    # -- running ----------------------------------------------------------------------------
    def _layer_weights(self, fetched: dict) -> tuple[dict[str, torch.Tensor], int]:
        """The fetched weights by local name, and the bytes of those decompressed here (a
        quant.QTensor is decompressed on the compute device, one layer at a time; a 4-bit
        Int4Weight is multiplied as it is and an Fp8Weight upcast per call, by `models.linear`)."""
        out, dense_bytes = {}, 0
        for name, w in fetched.items():
            if not isinstance(w, torch.Tensor) and type(w) not in KINDS:  # no kind multiplies it as it is
                w = w.dequantize(dtype=self.dtype, device=self.device)
                dense_bytes += tensor_bytes(w)
            out[self.local[name]] = w
        return out, dense_bytes

    def _fetch_timed(self, layer: int):
        """Load a layer's weights on a worker thread; the result carries the load's duration. A
        layer whose weights are all used where they live (the gpu tier; on a CPU-only machine the
        cpu tier too) is fetched here: nothing to overlap, and a thread's hand-over costs ~1 ms a
        layer on a busy machine."""
        def load():
            t = time.perf_counter()
            with self.copies.issuing():
                fetched, staged = self.store.fetch(self.layer_names[layer])
                done = self.copies.finished()
            return fetched, staged, time.perf_counter() - t, done

        if not self._copies_for[layer]:
            future = Future()
            future.set_result(load())
            return future
        return self.store.submit(load)

    HEAD_CHUNK_ROWS = HEAD_CHUNK_ROWS

    def _embed(self, glob: dict, step: Step) -> torch.Tensor:
        ids = step.input_ids
        uniq, remapped = torch.unique(ids, return_inverse=True)
        rows, staged = gather_rows(self.store, self.table_pieces["embed_tokens"], uniq)
        try:
            return self.fwd.embed({**glob, "embed_tokens": rows}, remapped.to(self.device), step.positions.to(self.device))
        finally:
            self.store.release(staged)

    def _logits(self, hs: list[torch.Tensor], limit=None) -> list[torch.Tensor]:
        """Each micro-batch's logits, in vocab chunks within one piece of the head (read from one
        tier): a chunk is read once a sweep, as the planner prices it, and multiplied by each
        micro-batch's rows in turn (each product as it would be alone), one chunk of logits held
        on the compute device at a time; the next chunk read meanwhile where the gpu tier stays
        under `limit()` (the sweep's charged peak, asked only when a chunk could be read ahead;
        None: its capacity)."""
        outs = [torch.empty((*h.shape[:-1], self.cfg.vocab_size), dtype=torch.float32) for h in hs]
        coded = self.charges.keeps_codes(self.head_pieces[0].name)  # read a piece at a time
        chunks = list(head_chunks(self.head_pieces, self.charges.head_chunk_rows if coded else self.HEAD_CHUNK_ROWS))
        widest = max(stop - start for _, start, stop in chunks)
        chunk_bytes = max(h.numel() // h.shape[-1] for h in hs) * widest * _bytes_per(self.dtype)
        self.budgets["gpu"].allocate(chunk_bytes, "logits of one vocab chunk")
        reads = HeadReads(self.store, self.budgets["gpu"], chunks, self.cfg.hidden_size * _bytes_per(self.dtype),
                          limit)
        try:
            for i, (_, start, stop) in enumerate(chunks):
                w, staged = reads.take(i)
                try:
                    for h, out in zip(hs, outs):  # rows on the compute device one micro-batch at a time
                        out[..., start:stop] = linear(h.to(self.device), as_logits_head(w)).float().cpu()
                finally:
                    self.store.release(staged)
        finally:
            reads.close()
            self.budgets["gpu"].free(chunk_bytes)
        return outs

    def _workspace_bytes(self, step: Step, span: int) -> int:
        n, t = step.input_ids.shape
        return workspace_bytes(self.model_spec, n, t, span, _bytes_per(self.dtype))

    @torch.inference_mode()
    def forward_steps(self, cache: TieredKVCache, steps: list[Step]) -> list[torch.Tensor]:
        """Run the micro-batches in one sweep. Decode micro-batches are merged into one when the
        policy says so (`merge_decode`, the planner's default) and the merged one's workspace
        fits the gpu budget: on hardware where small GEMMs are slow (a CPU) that is much
        faster, and the cache still moves per row only."""
        merged, sizes = self._merge_decodes(steps)
        if merged is None:
            return self._sweep(cache, steps)
        outs = self._sweep(cache, [merged] + [s for s in steps if s.input_ids.shape[1] != 1])
        decode_out = list(outs[0].split(sizes))
        rest = iter(outs[1:])
        return [decode_out.pop(0) if s.input_ids.shape[1] == 1 else next(rest) for s in steps]

    def _merge_decodes(self, steps: list[Step]):
        if not self.policy.merge_decode:
            return None, None
        decodes = [s for s in steps if s.input_ids.shape[1] == 1 and s.logit_rows is not None and s.segments is None
                   and s.cache_positions is None and s.logit_rows.dim() == 1]
        if len(decodes) < 2 or len(decodes) != sum(s.input_ids.shape[1] == 1 for s in steps):
            return None, None
        merged = Step(torch.cat([s.input_ids for s in decodes]), torch.cat([s.positions for s in decodes]),
                      torch.cat([s.slots for s in decodes]), torch.cat([s.logit_rows for s in decodes]))
        span = int(merged.positions.max()) + 1
        need = self.charges.sweep_gpu_peak([(len(merged.slots), 1, span)])  # a latent pool's misses included
        if need > self.budgets["gpu"].free_bytes:
            return None, None
        return merged, [len(s.slots) for s in decodes]

    def _sweep(self, cache: TieredKVCache, steps: list[Step]) -> list[torch.Tensor]:
        cfg, fwd, store = self.cfg, self.fwd, self.store
        prof = SweepProfile(prefill=any(s.input_ids.shape[1] > 1 for s in steps)) if self.record_profile else None
        t_sweep = time.perf_counter()
        glob_fetched, glob_staged = store.fetch(self.small_global_names)
        glob = self._layer_weights(glob_fetched)[0]
        act_tier = "cpu" if self.policy.activations.cpu == 1 else "gpu"  # one tier (CAPABILITIES)
        hidden, ctxs, act_bytes, pending = [], [], 0, None
        # what the dry run charges this sweep at most: reads ahead stay under it (a walk over every
        # layer's charges, so only worked out when the head has a chunk to read ahead)
        base, shapes = self.budgets["gpu"].used_bytes, [(s.input_ids.shape[0], s.input_ids.shape[1], s.span)
                                                        for s in steps]

        def peak_limit() -> int:
            return base + self.charges.sweep_gpu_peak(shapes)
        try:
            for s in steps:
                x = self._embed(glob, s)
                nb = x.numel() * x.element_size()
                self.budgets[act_tier].allocate(nb, f"activations ({act_tier})")
                act_bytes += nb
                hidden.append(x.to("cpu") if act_tier == "cpu" else x)
                ctxs.append((fwd.step_context(s.positions.to(self.device), self.dtype), self._attend_kwargs(cache, s)))
            pending = self._fetch_timed(0) if cfg.num_layers else None
            for j in range(cfg.num_layers):
                t0 = time.perf_counter()
                (fetched, staged, io_s, done), pending = pending.result(), None
                self.copies.hand_over(done, fetched.values())
                t_io = time.perf_counter()
                twin_bytes = self._reserve_int4_twins(j, steps)  # before the next layer's staging
                pending = self._fetch_timed(j + 1) if j + 1 < cfg.num_layers else None
                try:
                    self._run_layer(j, fetched, steps, hidden, ctxs, cache, act_tier, twin_bytes)
                finally:
                    store.release(staged)
                if prof is not None:
                    t1 = time.perf_counter()
                    prof.layer_s.append(t1 - t0)
                    prof.io_wait_s.append(t_io - t0)
                    prof.compute_s.append(t1 - t_io)
                    prof.io_s.append(io_s)
            for k, s in enumerate(steps):  # each replaces its hidden states, on their tier
                x = fwd.final_hidden(glob, s.pick_logit_rows(hidden[k].to(self.device)))
                hidden[k] = x.to("cpu") if act_tier == "cpu" else x
            outs = [fwd.finish_logits(logits) for logits in self._logits(hidden, peak_limit)]
            if prof is not None:
                prof.sweep_s = time.perf_counter() - t_sweep
                self.sweeps.append(prof)
            return outs
        finally:
            if pending is not None and pending.exception() is None:  # a layer raised: its next was read
                store.release(pending.result()[1])
            if act_bytes:
                self.budgets[act_tier].free(act_bytes)
            store.release(glob_staged)

    def _run_layer(self, j: int, fetched: dict, steps: list[Step], hidden: list, ctxs: list, cache,
                   act_tier: str, twin_bytes: int) -> None:
        """Layer j over every micro-batch (hidden[k] replaced by its output), its decompressed
        weights charged to the gpu tier meanwhile (`twin_bytes`: its 4-bit matrices' dense
        copies for the sweep, already charged; 0: dequantized per call)."""
        w, dense_bytes = self._layer_weights(fetched)
        # each dense copy is made (and prepacked) on its first call (`Int4Twin.dense`)
        twin = (lambda m: Int4Twin(m) if isinstance(m, Int4Weight) else m) \
            if twin_bytes else (lambda m: m)
        w = {name: twin(m) for name, m in w.items()}
        loads = self._expert_loads(j, twin)
        if loads is not None:
            w = loads.mapping(w, self.local, self.routing_counter)
        charged = 0
        try:
            if not twin_bytes:  # inside models.linear: 4-bit matrices dequantized per call
                dense_bytes += self.charges.int4_decompressed(j, max(s.input_ids.numel() for s in steps))
            dense_bytes += self.charges.fp8_upcast(j)  # FP8 matrices upcast per call
            self.budgets["gpu"].allocate(dense_bytes, f"layer {j} weights decompressed")
            charged = dense_bytes
            for k, s in enumerate(steps):
                hidden[k] = self._layer_step(j, w, s, hidden[k], ctxs[k], cache, act_tier)
        finally:
            if loads is not None:
                loads.finish()
                charged += loads.charged
            self.budgets["gpu"].free(charged + twin_bytes)

    def _expert_loads(self, j: int, twin) -> RoutedExpertLoads | None:
        """Layer j's routed experts, fetched as the forward reads them; None: it has none."""
        if j not in self.experts:
            return None

        def convert(fetched):
            w, dense_bytes = self._layer_weights(fetched)
            self.budgets["gpu"].allocate(dense_bytes, f"layer {j} experts decompressed")
            return {name: twin(m) for name, m in w.items()}, dense_bytes

        return RoutedExpertLoads(self.store, self.expert_cache, j, self.experts[j], convert,
                                 self.policy.cpu_expert_tokens, self.cpu_expert_reads, self.policy.expert_group)

    def _reserve_int4_twins(self, j: int, steps: list[Step]) -> int:
        """When several of the sweep's calls take a 4-bit matrix's dense path (prompt chunks of
        INT4_DENSE_FROM_ROWS rows or more), layer j's matrices are dequantized (and prepacked)
        once for all of them instead of once a call: the same values, so the same bits. Taken
        where the layer's whole need with them (`PlacementCharges.layer_need`: the next layer's
        staging included, which is why this runs before that prefetch) fits the gpu tier, as
        the dry run decides it; the planner reserves it. Returns the bytes charged (0: per call)."""
        shapes = [(s.input_ids.shape[0], s.input_ids.shape[1], s.span) for s in steps]
        need = self.charges.int4_twins_bytes(j)
        if (not need or not self.charges.wants_int4_twins(shapes)
                or self.charges.layer_need(j, shapes, True) > self.budgets["gpu"].free_bytes):
            return 0
        self.budgets["gpu"].allocate(need, f"layer {j} 4-bit weights dequantized for the sweep")
        return need

    @staticmethod
    def _attend_kwargs(cache, step: Step) -> dict:
        """`attend_fn`'s keywords for a step, the same for all its layers: the step's geometry
        (mask, span, rows per device), computed once, where the cache offers it."""
        if hasattr(cache, "step_geometry"):
            return {"geometry": cache.step_geometry(step.slots, step.write_positions, **step.geometry_kwargs)}
        return step.mask_kwargs

    def _layer_step(self, j: int, w: dict, step: Step, x, ctx, cache, act_tier: str):
        """Layer j over one micro-batch, its workspace charged to the gpu tier meanwhile;
        `ctx`: (the step's rotary tables, its `attend_fn` keywords), from `_sweep`."""
        rope, attend_kwargs = ctx
        geometry = attend_kwargs.get("geometry")
        ws = self._workspace_bytes(step, geometry.span if geometry is not None else step.span)
        self.budgets["gpu"].allocate(ws, "compute workspace")
        try:
            x = self.fwd.layer(w, x.to(self.device), rope,
                               cache.attend_fn(j, step.slots, step.write_positions, **attend_kwargs), j)
            return x.to("cpu") if act_tier == "cpu" else x
        finally:
            self.budgets["gpu"].free(ws)

    def overlap_report(self) -> dict[str, float]:
        """Steady-state (all sweeps but the first) per-layer wall time vs max(I/O, compute)."""
        sweeps = self.sweeps[1:] or self.sweeps
        wall = sum(sum(p.layer_s) for p in sweeps)
        bound = sum(max(io, c) for p in sweeps for io, c in zip(p.io_s, p.compute_s))
        io = sum(sum(p.io_s) for p in sweeps)
        compute = sum(sum(p.compute_s) for p in sweeps)
        return {"sweeps": len(sweeps), "wall_s": wall, "io_s": io, "compute_s": compute,
                "max_io_compute_s": bound, "ratio": wall / bound if bound else float("nan")}

    def close(self) -> None:
        self.expert_cache.clear()
        self.store.close()


def _stable_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:24]
