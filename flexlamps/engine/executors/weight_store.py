"""The offload executor's weights: placed on the tiers by `PlacementCharges` (the map its dry run
charges, so the store and its charges on paper are one placement), stored in the forms the weight
kinds multiply (compressed, FP8/MXFP4 or a GGUF's blocks as the checkpoint has them, prepacked
where resident), and fetched a layer at a time for a `Sweep`."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from concurrent.futures import Future

import torch

from flexlamps import fault_points
from flexlamps.cache_folder import default_offload_dir
from flexlamps.engine.executors.charges import PlacementCharges
from flexlamps.engine.executors.copy_stream import CopyStream
from flexlamps.engine.executors.expert_weights import ExpertCache, experts_by_layer
from flexlamps.engine.executors.placement_map import TABLE_NAMES
from flexlamps.engine.executors.stored_weights import int4_format_tag
from flexlamps.models.blocks.dense_gemm import pack
from flexlamps.models.blocks.weight_kind import KINDS
from flexlamps.models.loading.in_place import in_place_form, in_place_sample, in_place_specs, packs_five_bit
from flexlamps.models.weight_specs import weight_specs
from offload import DiskFolder, TieredStore, tensor_bytes
from offload.store import stored_parts
from quant import QTensor, quantize
from quant.fp8 import Fp8Weight
from quant.int4_weight import Int4Weight

# part of an offload folder's fingerprint when FP8 matrices are kept FP8 (`Fp8Weight.to_tensors`)
FP8_FORMAT = "fp8-v1"
MXFP4_FORMAT = "mxfp4-v1"  # the same for MXFP4 matrices (`Mxfp4Weight.to_tensors`)
IN_PLACE_FORMAT = "blocks-v1"  # the same for a GGUF's blocks kept as codes (`models.loading.in_place`)


def in_place_samples(reader, dtype: torch.dtype) -> tuple[dict, dict]:
    """({name: the file tensor's spec}, {name: a matrix in the form kept}) of the file's blocks kept
    as codes (sizes, layouts): those the in-memory executor keeps so."""
    specs = in_place_specs(reader, weight_specs(reader.config), dtype)
    return specs, {name: in_place_sample(reader, spec, dtype) for name, spec in specs.items()}


class WeightStore:
    """Every weight of one model on its tier as `charges` places it, and the reads a sweep makes.
    `in_place`: {name: the file tensor's spec} of the blocks kept as codes (`in_place_samples`);
    `qcfg` / `weight_quantizer`: the compression backend (group-wise, or bitsandbytes');
    `int4`: compressed matrices are `Int4Weight`s. Owns the tiered store and its worker threads."""

    def __init__(self, reader, charges: PlacementCharges, budgets: dict, device: torch.device, *, in_place: dict,
                 qcfg=None, weight_quantizer=None, int4: bool = False, offload_dir=None, verify_disk: bool = True,
                 expert_cache: str = "cyclic"):
        self.cfg, self.charges, self.policy, self.dtype, self.device = reader.config, charges, charges.policy, \
            charges.dtype, device
        self.in_place, self.qcfg, self.weight_quantizer = in_place, qcfg, weight_quantizer
        self.stored_weights, self.specs = charges.weights, charges.specs
        self.placement = charges.placement
        self.tiers, self.table_pieces = self.placement.tiers, self.placement.pieces
        disk = self._disk_folder(reader, offload_dir, int4) if "disk" in self.tiers.values() else None
        self.store = TieredStore(budgets, disk, device)
        self.copies = CopyStream(device)  # on CUDA: weight loads on a copy stream, joined by events
        self.reused_disk = False
        try:
            self._place_weights(reader, disk, verify_disk)
        except BaseException:
            self.store.close()  # frees the worker threads and the offload folder's lock
            raise
        self._index_weights(budgets["gpu"], expert_cache)

    # -- placing ----------------------------------------------------------------------------
    def _index_weights(self, gpu_budget, expert_cache: str) -> None:
        """Which weights a sweep reads where: globals, each layer's own, its routed experts."""
        # the embedding table and output head are read in parts (rows looked up, head in vocab
        # chunks), so they never have to be staged whole on the gpu tier
        self.small_global_names = [s.name for s in self.specs if s.layer is None and s.name not in TABLE_NAMES]
        self.head_pieces = self.table_pieces.get("lm_head") or self.table_pieces["embed_tokens"]
        # a layer's routed experts are fetched when its router has picked them (`expert_weights`)
        self.experts = experts_by_layer(self.specs)
        self.expert_cache = ExpertCache(gpu_budget, expert_cache, self.cfg.num_layers)
        self.cpu_expert_reads = Counter()  # cpu-tier experts read "in place" or "staged" (`RoutedExpertLoads`)
        self.layer_names = self.charges.layer_names  # each layer's weights but its routed experts
        in_place = ("gpu", "cpu") if self.device.type == "cpu" else ("gpu",)  # tiers fetched without a copy
        self._copies_for = [any(self.store.tier_of(n) not in in_place for n in names) for names in self.layer_names]
        self.local = {s.name: s.local_name for s in self.specs}
        per_layer = [sum(s.numel for s in specs) for specs in self.charges.layer_specs]
        self.max_layer_bytes = max(per_layer, default=0) * element_bytes(self.dtype)

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

    def layer_weights(self, fetched: dict) -> tuple[dict[str, torch.Tensor], int]:
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

    def fetch_timed(self, layer: int):
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

    def close(self) -> None:
        self.expert_cache.clear()
        self.store.close()


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _stable_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]
