"""The offload executor's weights: a `WeightStore` places every weight on a tier (`placement_map`),
decides the one form each is stored in (`form`: compressed, FP8/MXFP4 or a GGUF's blocks as the
checkpoint has them, prepacked where resident) and sizes every stored tensor in it. As built it is
on paper: that is what the dry run charges (`charges.PlacementCharges`). `write` then reads the
checkpoint into a tiered store in those forms, fetched a layer at a time for a `Sweep`: the
executor's store and its dry run's are the same code and the same placement."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from concurrent.futures import Future

import torch

import placement
from flexlamps import fault_points
from flexlamps.cache_folder import default_offload_dir
from flexlamps.engine.executors.copy_stream import CopyStream
from flexlamps.engine.executors.expert_weights import ExpertCache, experts_by_layer
from flexlamps.engine.executors.placement_map import TABLE_NAMES, place_weights
from flexlamps.engine.executors.stored_weights import (StoredWeights, fp8_nbytes, int4_format_tag, int4_weights,
                                                       stored_nbytes)
from flexlamps.models.blocks.dense_gemm import pack
from flexlamps.models.blocks.weight_kind import EXPANDED_ON_ARRIVAL, KINDS, WeightKind
from flexlamps.models.config import ModelConfig
from flexlamps.models.loading.in_place import (TIED_HEAD, coded_matrix, in_place_form, in_place_specs,
                                               packs_five_bit, packs_six_bit)
from flexlamps.models.loading.mapped_pages import owned
from flexlamps.models.weight_specs import WeightSpec, weight_specs
from offload import DiskFolder, TieredStore, compute_device, tensor_bytes
from placement.cost_memory import HEAD_CHUNK_ROWS
from quant import QTensor, quantize
from quant.fp8 import Fp8Weight
from quant.int4_weight import Int4Weight
from quant.mxfp4 import Mxfp4Weight, mxfp4_nbytes

# part of an offload folder's fingerprint when FP8 matrices are kept FP8 (`Fp8Weight.to_tensors`)
FP8_FORMAT = "fp8-v1"
MXFP4_FORMAT = "mxfp4-v1"  # the same for MXFP4 matrices (`Mxfp4Weight.to_tensors`)
# the same for a GGUF's blocks kept as codes (`models.loading.in_place`; v2: Q6_K's 6-bit form, its scales
# alone; v3: Q4_K's scales as the file holds them, `Int4Weight.from_k_blocks`; v4: Q6_K's, `from_k6_blocks`)
IN_PLACE_FORMAT = "blocks-v4"
# a table kept as codes is cut on whole kernel tiles (`Int4Weight.rows`), a piece a head chunk
CODED_TABLE_ROWS = 64
# each stored form (`WeightStore.form`): its class when read back from disk, the kind that runs it
FORM_CLASSES = {"int4": Int4Weight, "quantized": QTensor, "fp8": Fp8Weight, "mxfp4": Mxfp4Weight}
FORM_KINDS = {"int4": KINDS[Int4Weight], "quantized": EXPANDED_ON_ARRIVAL, "fp8": KINDS[Fp8Weight],
              "mxfp4": KINDS[Mxfp4Weight], "dense": KINDS[torch.Tensor]}


def in_place_coded(reader, dtype: torch.dtype) -> tuple[dict, dict]:
    """({name: the file tensor's spec}, {name: its `CodedMatrix`, the form kept, described}) of the
    file's blocks kept as codes: those the in-memory executor keeps so. Nothing is built: a sample
    of the tied head alone took a 1B's process from 278 to 1455 MiB peak RSS."""
    specs = in_place_specs(reader, weight_specs(reader.config), dtype)
    return specs, {name: coded_matrix(reader, spec, dtype) for name, spec in specs.items()}


def in_place_bytes(coded: dict) -> dict[str, int]:
    """{name: bytes} of the blocks kept as codes (`in_place_coded`'s), as their kind stores them
    (`gguf_codes.coded_nbytes`): what the store charges them (`WeightStore._stored_bytes`), and the
    planner's LP too (`planning.policy_choice`, `models.description.with_codes`)."""
    return {name: w.nbytes for name, w in coded.items()}


class WeightStore:
    """Every weight of one model on its tier in its stored form, on paper until `write`.

    `int4`: compressed matrices are 4-bit `Int4Weight`s (default: as the policy says);
    `device_type`: the compute device's (the forms depend on it; default: this machine's);
    `stores_fp8` / `stores_mxfp4`: which weights an FP8 / MXFP4 checkpoint holds so (its reader's;
    default: as DeepSeek-V3 / gpt-oss ship them); `routing`: a MoE model's
    `placement.routing.RoutingProfile` (hottest experts placed first); `weight_bits`: the
    compressed weights' bits (default: the policy's; `--weight-quant groupwise8`: 8); `in_place`:
    {name: the form a checkpoint's blocks are kept in, described} (`in_place_coded`: a GGUF's
    codes; a tied head under "lm_head"), each stored so and sized by `gguf_codes.coded_nbytes`."""

    def __init__(self, config: ModelConfig, policy: placement.Policy, dtype: torch.dtype, *, int4: bool | None = None,
                 device_type: str | None = None, stores_fp8=None, stores_mxfp4=None, routing=None,
                 weight_bits: int | None = None, in_place: dict | None = None):
        self.cfg, self.policy, self.dtype = config, policy, dtype
        self.dtype_bytes = element_bytes(dtype)
        self.device_type = device_type or compute_device().type
        self.weight_bits = weight_bits or policy.compression.num_bits
        self.stored_weights = StoredWeights(config, dtype, self.device_type,
                                            int4_weights(policy) if int4 is None else int4, config.storage.fp8_block,
                                            stores_fp8, config.storage.mxfp4, stores_mxfp4)
        self.in_place = dict(in_place or {})
        self.specs = self.stored_weights.specs  # as stored: 4-bit q/k/v and gate/up stacked
        if TIED_HEAD in self.in_place and all(s.name != TIED_HEAD for s in self.specs):  # beside the table
            self.specs.append(WeightSpec(TIED_HEAD, next(s.shape for s in self.specs if s.name == "embed_tokens"),
                                         "embed", None))
        self.spec_named = {s.name: s for s in self.specs}
        self.placement = place_weights(config, policy.weights, lambda spec: self._stored_bytes(spec, "disk"),
                                       self.specs, expert_order=routing.expert_order if routing is not None else None,
                                       table_rows={name: (CODED_TABLE_ROWS, HEAD_CHUNK_ROWS) for name in TABLE_NAMES
                                                   if self.keeps_codes(name)})
        self.tiers, self.table_pieces = self.placement.tiers, self.placement.pieces  # each weight, each table piece
        self.stored = self._stored_sizes()
        self.store = None  # the tiered store, once written
        self._index_weights()

    @property
    def on_paper(self) -> bool:
        """Placed and sized, nothing read nor held (the dry run's); False once `write` stored it."""
        return self.store is None

    def _stored_sizes(self) -> dict[str, int]:
        """Bytes of every stored tensor: each weight on its tier, each table piece."""
        stored = {s.name: self._stored_bytes(s, self.tiers[s.name]) for s in self.specs if s.name not in TABLE_NAMES}
        for spec in self.specs:
            for piece in self.table_pieces.get(spec.name, ()):
                coded = self.coded_piece(spec.name, piece)
                stored[piece.name] = coded.nbytes if coded is not None else \
                    stored_nbytes((piece.num_rows, *spec.shape[1:]), self.dtype, None, False)
        return stored

    def _index_weights(self) -> None:
        """Which weights a sweep reads where: globals, each layer's own, its routed experts."""
        # the embedding table and output head are read in parts (rows looked up, head in vocab
        # chunks), so they never have to be staged whole on the gpu tier
        self.small_global_names = [s.name for s in self.specs if s.layer is None and s.name not in TABLE_NAMES]
        self.head_pieces = self.table_pieces.get("lm_head") or self.table_pieces["embed_tokens"]
        # a head kept as codes is read a piece at a time (whole tiles); else in chunks within a piece
        coded_head = self.keeps_codes(self.head_pieces[0].name)
        self.head_chunk_rows = max([HEAD_CHUNK_ROWS] + [p.num_rows for p in self.head_pieces if coded_head])
        # a layer's routed experts are fetched when its router has picked them (`expert_weights`)
        self.experts = experts_by_layer(self.specs)
        routed = {name for experts in self.experts.values() for names in experts.values() for name in names}
        self.layer_specs = [[] for _ in range(self.cfg.num_layers)]  # each layer's weights, indexed once
        for spec in self.specs:
            if spec.layer is not None:
                self.layer_specs[spec.layer].append(spec)
        self.layer_names = [[s.name for s in specs if s.name not in routed] for specs in self.layer_specs]
        self.local = {s.name: s.local_name for s in self.specs}
        per_layer = [sum(s.numel for s in specs) for specs in self.layer_specs]
        self.max_layer_bytes = max(per_layer, default=0) * self.dtype_bytes

    # -- forms and bytes --------------------------------------------------------------------
    def form(self, spec) -> str:
        """How weight `spec` is stored, the one decision its bytes, its writes and its reads follow:
        "int4" / "quantized" (compressed by the policy: `Int4Weight`s, or the group-wise or
        bitsandbytes backend's form), "fp8" / "mxfp4" (kept as the checkpoint stores it), "codes"
        (a checkpoint's blocks, `in_place`) or "dense" (as read; prepacked where resident)."""
        if self.compressed(spec):
            return "int4" if self.stored_weights.is_int4(spec) else "quantized"
        if self.stored_weights.is_fp8(spec):
            return "fp8"
        if self.stored_weights.is_mxfp4(spec):
            return "mxfp4"
        return "codes" if spec.name in self.in_place else "dense"

    def stored_kind(self, spec) -> WeightKind | None:
        """The kind that runs weight `spec` in its stored form (`weight_kind`); None: a checkpoint's
        blocks kept as codes, charged as stored only (a call's copy of them lives in the thread's
        reused buffer, `dense_scratch`, as in the in-memory engine)."""
        return FORM_KINDS.get(self.form(spec))

    def keeps_codes(self, name: str) -> bool:
        """Whether weight `name` is stored as its checkpoint's blocks (a table's pieces: by the table's name)."""
        spec = self.spec_named.get(name.split(".rows")[0])
        return spec is not None and self.form(spec) == "codes"

    def coded_piece(self, name: str, piece=None):
        """The form weight `name` (or its table piece) is stored in when kept as codes (a `CodedMatrix`), else None."""
        if not self.keeps_codes(name):
            return None
        coded = self.in_place[name.split(".rows")[0]]
        return coded if piece is None or piece.num_rows == coded.shape[0] else coded.rows(piece.start, piece.stop)

    def compressed(self, spec) -> bool:
        """Compressed by the policy: every matrix but an MXFP4 checkpoint's, which is 4-bit
        already (quantizing its dequantized values again would add error and save nothing)."""
        return self.policy.compress_weight and spec.role == "linear" and not self.stored_weights.is_mxfp4(spec)

    def kept_class(self, spec) -> type | None:
        """The class of a weight kept as its checkpoint stores it (FP8 or MXFP4), else None."""
        form = self.form(spec)
        return FORM_CLASSES[form] if form in ("fp8", "mxfp4") else None

    def is_fp8(self, spec) -> bool:
        return self.form(spec) == "fp8"

    def is_mxfp4(self, spec) -> bool:
        return self.form(spec) == "mxfp4"

    def _stored_bytes(self, spec, tier: str) -> int:
        """Bytes of a weight as stored on `tier` (off the gpu tier: what the split shares out)."""
        form, shape = self.form(spec), tuple(spec.shape)
        if form == "int4":
            return self.stored_weights.int4_nbytes(spec, tier, self.in_place)
        if form == "codes":
            return self.in_place[spec.name].nbytes
        if form == "fp8":
            return fp8_nbytes(shape, self.stored_weights.fp8_block, self.dtype)
        if form == "mxfp4":
            return mxfp4_nbytes(shape)
        prepacked = form == "dense" and tier == "gpu" and spec.role == "linear" and spec.layer is not None
        return stored_nbytes(shape, self.dtype, self.weight_bits if form == "quantized" else None, prepacked)

    def staged(self, names) -> int:
        """Bytes a fetch of `names` stages on the gpu tier (those not resident there)."""
        return sum(self.stored[n] for n in names if self.tiers[n] != "gpu")

    # -- writing ----------------------------------------------------------------------------
    def write(self, reader, budgets: dict, device: torch.device, *, in_place: dict, qcfg=None, weight_quantizer=None,
              offload_dir=None, verify_disk: bool = True, expert_cache: str = "cyclic") -> "WeightStore":
        """Read `reader`'s weights into a tiered store charged to `budgets`, each in its form on
        its tier. `in_place`: {name: the file tensor's spec} of the blocks kept as codes
        (`in_place_coded`); `qcfg` / `weight_quantizer`: the compression backend (group-wise, or
        bitsandbytes'). Owns the tiered store and its worker threads from here on."""
        self.device, self.file_in_place, self.qcfg, self.weight_quantizer = device, in_place, qcfg, weight_quantizer
        disk = self._disk_folder(reader, offload_dir) if "disk" in self.tiers.values() else None
        self.store = TieredStore(budgets, disk, device)
        self.copies = CopyStream(device)  # on CUDA: weight loads on a copy stream, joined by events
        self.reused_disk = False
        try:
            self._place_weights(reader, disk, verify_disk)
        except BaseException:
            self.store.close()  # frees the worker threads and the offload folder's lock
            raise
        self.expert_cache = ExpertCache(budgets["gpu"], expert_cache, self.cfg.num_layers)
        self.cpu_expert_reads = Counter()  # cpu-tier experts read "in place" or "staged" (`RoutedExpertLoads`)
        in_place_tiers = ("gpu", "cpu") if device.type == "cpu" else ("gpu",)  # tiers fetched without a copy
        self._copies_for = [any(self.store.tier_of(n) not in in_place_tiers for n in names)
                            for names in self.layer_names]
        return self

    def _disk_folder(self, reader, offload_dir) -> DiskFolder:
        offload_dir = default_offload_dir() if offload_dir is None else offload_dir
        # the folder's contents depend on the model, the dtype, the weight split and compression
        # (and the form 4-bit weights are written in: another form is rebuilt, never read)
        policy, forms = self.policy, {self.form(s) for s in self.specs}
        owner = f"{reader.fingerprint()}|{self.dtype}|{policy.weights!r}|{policy.compress_weight}|{self.qcfg!r}"
        owner += f"|{int4_format_tag(self.device)}" if self.stored_weights.int4 or "codes" in forms else ""
        owner += f"|{IN_PLACE_FORMAT}|five-bit {packs_five_bit()}|six-bit {packs_six_bit()}" if "codes" in forms else ""
        owner += f"|{FP8_FORMAT}" if "fp8" in forms else ""
        owner += f"|{MXFP4_FORMAT}" if "mxfp4" in forms else ""
        return DiskFolder(offload_dir, fingerprint=_stable_hash(owner))

    def _place_weights(self, reader, disk: DiskFolder | None, verify: bool) -> None:
        skip = set()  # stored tensors already in a reused offload folder
        if disk is not None:
            disk_names = [name for name, tier in self.tiers.items() if tier == "disk"]
            names = self._disk_part_names(disk_names)
            disk.claim()
            self.reused_disk = disk.try_reuse(names, verify=verify)
            disk.check_room(sum(self.stored[n] for n in disk_names), self.reused_disk)
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
        pieces, form = self.placement.pieces_of(spec), self.form(spec)
        for piece in pieces:
            if piece.name in skip:
                self.store.adopt_disk(piece.name, self._stored_class(spec))
        todo = [piece for piece in pieces if piece.name not in skip]
        if not todo:
            return
        if form == "codes":  # the file's blocks, as the in-memory engine keeps them; a table's piece built alone
            for piece in todo:
                piece_rows = None if len(pieces) == 1 else (piece.start, piece.stop)
                self.store.put(piece.name, in_place_form(reader, self.file_in_place[spec.name], self.dtype, piece_rows),
                               piece.tier)
        elif form == "int4":  # a matrix: one piece
            self.store.put(spec.name, self.stored_weights.read_int4(reader, spec, todo[0].tier, self.device),
                           todo[0].tier)
        elif form in ("fp8", "mxfp4"):  # a matrix: one piece, kept as the checkpoint has it
            read = reader.read_fp8 if form == "fp8" else reader.read_mxfp4
            self.store.put(spec.name, read(spec, self.dtype), todo[0].tier)
        else:
            self._store_dense(reader, spec, pieces, todo)

    def _store_dense(self, reader, spec, pieces, todo) -> None:
        """A weight read dense: a table's pieces each read alone where the reader can (no dense copy of
        the whole: a 1B's is 501 MiB), else from the whole, read once, as copies (not kept alive)."""
        read_rows = getattr(reader, "read_rows", None) if len(pieces) > 1 else None
        w = None
        for piece in todo:
            part = None if read_rows is None else read_rows(spec, self.dtype, piece.start, piece.stop)
            if part is None:
                w = self.stored_weights.read_dense(reader, spec) if w is None else w
                part = w if len(pieces) == 1 else w[piece.start:piece.stop].clone()
            self.store.put(piece.name, self._stored_form(spec, part, piece.tier), piece.tier)

    def _stored_class(self, spec) -> type | None:
        """What a weight was stored as, when not dense (to rebuild it from its parts)."""
        form = self.form(spec)
        return self.in_place[spec.name].cls if form == "codes" else FORM_CLASSES.get(form)

    def _stored_form(self, spec, w: torch.Tensor, tier: str):
        """A weight read dense as the store keeps it: compressed, prepacked for the GEMM, or as read."""
        if self.form(spec) == "quantized":
            return self.weight_quantizer.quantize(w) if self.weight_quantizer is not None else quantize(w, self.qcfg)
        if tier == "gpu" and spec.role == "linear" and spec.layer is not None and self.device.type == "cpu":
            return pack(w)  # resident for the whole run: prepacked once for oneDNN (the planner prices it so)
        # a memory tier holds its own copy, never a view of the checkpoint's mapped pages (`owned`)
        return w if tier == "disk" else owned(w)

    def _disk_part_names(self, disk_names) -> set[str]:
        names = set()
        for name in disk_names:
            spec = self.spec_named[name.split(".rows")[0]]
            form = self.form(spec)
            if form == "codes":
                names |= set(self.coded_piece(name, self._piece_named(name)).part_names(name + "::"))
            elif form == "int4":
                names |= set(self.stored_weights.int4_part_names(spec, "disk"))
            elif form == "quantized":
                names |= {f"{name}::codes", f"{name}::scales", f"{name}::meta", f"{name}::mins"}
            elif form in ("fp8", "mxfp4"):
                names |= set(FORM_CLASSES[form].part_names(f"{name}::"))
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
        if self.on_paper:  # nothing held
            return
        self.expert_cache.clear()
        self.store.close()


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _stable_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]
