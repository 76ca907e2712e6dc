"""One sweep of the offload executor: a list of micro-batches (prefills and decodes mixed) through
the model layer by layer over a `WeightStore`, in FlexGen's zig-zag order: while layer j computes
on every micro-batch, layer j+1's weights load on a worker thread, so each layer's I/O is paid
once per sweep for the whole block and hidden behind compute. Every charge to the tier budgets is
the one `PlacementCharges` computes on paper (the dry run's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flexlamps.engine.caches.tiered import TieredKVCache
from flexlamps.engine.executors.charges import PlacementCharges
from flexlamps.engine.executors.expert_weights import (ExpertPlace, RoutedExpertLoads, expert_place,
                                                       local_expert_names)
from flexlamps.engine.executors.experts_ahead import ExpertsAhead
from flexlamps.engine.executors.split_tables import HeadReads, gather_rows, head_chunks
from flexlamps.engine.executors.step import Step
from flexlamps.engine.executors.thread_clock import thread_clock
from flexlamps.engine.executors.weight_store import WeightStore, element_bytes
from flexlamps.models.blocks.linear import Int4Twin, as_logits_head, linear
from flexlamps.models.loading.mapped_pages import anon_resident_bytes, heap_free_bytes, release_heap
from placement.cost_memory import HEAD_CHUNK_ROWS, workspace_bytes
from quant.int4_weight import Int4Weight


# a prompt micro-batch with at least this much workspace ends in a trim (`trims_heap_after`): it frees
# enough for the holes to matter (the MoE job's 347 MiB: +35-115 MiB of free heap a micro-batch) and
# computes for long enough (seconds) that a trim's few ms (2.4-100 measured) are noise; smaller
# micro-batches' trims would cost a visible share and their holes are small
MICRO_BATCH_TRIM_BYTES = 64 << 20
# a layer's end trims only a heap with at least 1/HEAP_TRIM_SHARE of the host memory budgeted free: the
# next layer faults back what a trim gives it and reuses (SmolLM2's 4-bit disk 32x4: ~170 MiB free of 16
# GiB budgeted, its prompt trims 5-11% of the run), while the MoE job's 3.1 GiB heap frees more
HEAP_TRIM_SHARE = 32


def trims_heap_after(layer: int, layers: int, prefill: bool, micro_batch_workspace: int | None = None, *,
                     host_budget: int = 0, free_heap: Callable[[], int | None] | None = None) -> bool:
    """The sweep's one heap policy: `release_heap` after every layer of a sweep with a prompt, after
    the last layer of a decode sweep, and after a large prompt micro-batch (`micro_batch_workspace`:
    asked between a layer's micro-batches with the workspace of the one just run, `prefill` its having
    a prompt; `MICRO_BATCH_TRIM_BYTES`); a layer's end only where the heap's free bytes (`free_heap`,
    default `heap_free_bytes`, read there alone) are at least 1/HEAP_TRIM_SHARE of `host_budget`, the
    bytes the host's tiers are budgeted (0, or the free bytes unknown: always). glibc keeps what is
    freed (`host_allocator`: trimming off, so pages are reused): a prompt layer frees activations the
    next one does not reuse (0.6-1.2 GB free in the MoE job's heap); a prompt micro-batch's transients
    do not fit back into the holes the one before left (the MoE job, 63 x 128 tokens a micro-batch: the free heap 122 -> 501 MiB over a layer's 6
    micro-batches at a flat heap in use, the resident peak 2757 -> 3029 MiB; trimmed, 2752-2820
    throughout); decode sweeps' leftovers piled up sweep on sweep without a trim (the MoE job: +230 MiB
    over 63, OOM-killed under its cap); a decode layer's disk-expert staging is what the next layer
    reuses, so a trim a decode layer only has it faulted back in (docs/performance.md:
    scripts/bench_heap_trim.py, scripts/probe_prompt_transients.py)."""
    if micro_batch_workspace is not None:
        return prefill and micro_batch_workspace >= MICRO_BATCH_TRIM_BYTES
    if not (prefill or layer == layers - 1):
        return False
    free = (free_heap or heap_free_bytes)() if host_budget else None
    return free is None or free * HEAP_TRIM_SHARE >= host_budget


class HeapWatch:
    """`heap_free_bytes` for `trims_heap_after`, read again only where the last reading was at least
    1/HEAP_TRIM_SHARE of the host budget (a trim followed) or the anonymous resident bytes moved by
    1/(2 HEAP_TRIM_SHARE) of it since: a reading costs ~2.4 ms (mallinfo2 walks the free lists), 45 a
    SmolLM2 generate (~4% of it), and the resident peak grows only as the anonymous bytes do."""

    def __init__(self, read_free: Callable[[], int | None] | None = None,
                 read_anon: Callable[[], int | None] | None = None):
        self.read_free, self.read_anon = read_free, read_anon  # None: this module's, looked up at the call
        self.anon: int | None = None
        self.free: int | None = None

    def free_bytes(self, host_budget: int) -> int | None:
        anon = (self.read_anon or anon_resident_bytes)()
        settled = anon is not None and self.anon is not None and self.free is not None \
            and self.free * HEAP_TRIM_SHARE < host_budget and abs(anon - self.anon) * 2 * HEAP_TRIM_SHARE < host_budget
        if not settled:
            self.anon, self.free = anon, (self.read_free or heap_free_bytes)()
        return self.free


@dataclass
class SweepProfile:
    """Per layer: wall time, time spent waiting for its weights, compute time, and how long its
    weight load took on the I/O thread. Perfect overlap makes wall == max(io, compute).
    `sweep_s`: the whole sweep, embeddings and output head included; `prefill`: it had a prompt;
    `cpu_s` / `run_queue_s`: the sweep thread's CPU seconds in it and its seconds waiting for a core
    (`thread_clock`; the rest of `sweep_s` it was blocked)."""
    sweep_s: float = 0.0
    prefill: bool = False
    layer_s: list[float] = field(default_factory=list)
    io_wait_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    io_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    run_queue_s: float = 0.0


class Sweep:
    """Runs micro-batches over `weights` with the model's forward `fwd`, charging `budgets` what
    `charges` (over the same store) says.
    `record_profile`: every sweep appends a SweepProfile to `profiles`; `routing_counter`: a
    RoutingCounter told every MoE layer's routing, when set; `head_chunk_rows`: vocab rows of the
    output head multiplied at once (within a piece)."""

    def __init__(self, weights: WeightStore, charges: PlacementCharges, fwd, budgets: dict, device: torch.device):
        self.weights, self.charges, self.fwd, self.budgets, self.device = weights, charges, fwd, budgets, device
        self.cfg, self.policy, self.dtype = weights.cfg, weights.policy, weights.dtype
        self.model_spec = charges.model_spec
        self.head_chunk_rows = HEAD_CHUNK_ROWS
        self.record_profile = False
        self.profiles: list[SweepProfile] = []
        self.heap = HeapWatch()  # the free heap for a layer's end trim, read where it may have moved
        self.routing_counter = None
        self._expert_names: dict[int, tuple] = {}  # layer -> its experts' local names (`local_expert_names`)
        self._expert_places: dict = {}  # (layer, expert) -> where it lives (`ExpertPlace`)
        self._experts_as_stored: dict = {}  # (layer, expert) -> its in-place weights, as stored
        # decode steps read the next layer's predicted disk experts early (`experts_ahead`); off: on the MoE
        # bench's random checkpoint the prediction recalls 0.37 of a layer's experts and measured no faster
        self.read_ahead = False
        self.read_ahead_picks = 0  # experts predicted per token (0: as many as its router picks)
        self._ahead: ExpertsAhead | None = None

    def _embed(self, glob: dict, step: Step) -> torch.Tensor:
        ids = step.input_ids
        uniq, remapped = torch.unique(ids, return_inverse=True)
        rows, staged = gather_rows(self.weights.store, self.weights.table_pieces["embed_tokens"], uniq)
        try:
            return self.fwd.embed({**glob, "embed_tokens": rows}, remapped.to(self.device), step.positions.to(self.device))
        finally:
            self.weights.store.release(staged)

    def _logits(self, hs: list[torch.Tensor], limit=None) -> list[torch.Tensor]:
        """Each micro-batch's logits, in vocab chunks within one piece of the head (read from one
        tier): a chunk is read once a sweep, as the planner prices it, and multiplied by each
        micro-batch's rows in turn (each product as it would be alone), one chunk of logits held
        on the compute device at a time; the next chunk read meanwhile where the gpu tier stays
        under `limit()` (the sweep's charged peak, asked only when a chunk could be read ahead;
        None: its capacity)."""
        outs = [torch.empty((*h.shape[:-1], self.cfg.vocab_size), dtype=torch.float32) for h in hs]
        coded = self.weights.keeps_codes(self.weights.head_pieces[0].name)  # read a piece at a time
        chunk_rows = self.weights.head_chunk_rows if coded else self.head_chunk_rows
        chunks = list(head_chunks(self.weights.head_pieces, chunk_rows))
        widest = max(stop - start for _, start, stop in chunks)
        chunk_bytes = max(h.numel() // h.shape[-1] for h in hs) * widest * element_bytes(self.dtype)
        self.budgets["gpu"].allocate(chunk_bytes, "logits of one vocab chunk")
        row_bytes = self.cfg.hidden_size * element_bytes(self.dtype)
        reads = HeadReads(self.weights.store, self.budgets["gpu"], chunks, row_bytes, limit)
        try:
            for i, (_, start, stop) in enumerate(chunks):
                w, staged = reads.take(i)
                try:
                    for h, out in zip(hs, outs):  # rows on the compute device one micro-batch at a time
                        out[..., start:stop] = linear(h.to(self.device), as_logits_head(w)).float().cpu()
                finally:
                    self.weights.store.release(staged)
        finally:
            reads.close()
            self.budgets["gpu"].free(chunk_bytes)
        return outs

    def _workspace_bytes(self, step: Step, span: int) -> int:
        n, t = step.input_ids.shape
        return workspace_bytes(self.model_spec, n, t, span, element_bytes(self.dtype))

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
        cfg, fwd, store = self.cfg, self.fwd, self.weights.store
        prefill = any(s.input_ids.shape[1] > 1 for s in steps)
        prof = SweepProfile(prefill=prefill) if self.record_profile else None
        t_sweep, clock = time.perf_counter(), thread_clock()
        glob_fetched, glob_staged = store.fetch(self.weights.small_global_names)
        glob = self.weights.layer_weights(glob_fetched)[0]
        act_tier = "cpu" if self.policy.activations.cpu == 1 else "gpu"  # one tier (CAPABILITIES)
        hidden, ctxs, act_bytes, pending = [], [], 0, None
        # what the dry run charges this sweep at most: reads ahead (the head's, experts') stay under it
        # (a walk over every layer's charges: worked out only once one could start)
        base, shapes = self.budgets["gpu"].used_bytes, _shapes(steps)

        def peak_limit() -> int:
            return base + self.charges.sweep_gpu_peak(shapes)
        ahead = self._experts_ahead(prefill, peak_limit)
        try:
            nb = self.charges.activation_bytes(shapes)
            self.budgets[act_tier].allocate(nb, f"activations ({act_tier})")
            act_bytes = nb  # freed below once allocated
            hidden = self._activations(act_tier, steps)
            for s, h in zip(steps, hidden):
                h.copy_(self._embed(glob, s))
                ctxs.append((fwd.step_context(s.positions.to(self.device), self.dtype), self._attend_kwargs(cache, s)))
            pending = self.weights.fetch_timed(0) if cfg.num_layers else None
            for j in range(cfg.num_layers):
                t0 = time.perf_counter()
                (fetched, staged, io_s, done), pending = pending.result(), None
                self.weights.copies.hand_over(done, fetched.values())
                t_io = time.perf_counter()
                twin_bytes = self._reserve_int4_twins(j, steps)  # before the next layer's staging
                pending = self.weights.fetch_timed(j + 1) if j + 1 < cfg.num_layers else None
                try:
                    self._run_layer(j, fetched, steps, hidden, ctxs, cache, twin_bytes, ahead)
                finally:
                    store.release(staged)
                self._trim_after(j, prefill)
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
                prof.cpu_s, prof.run_queue_s = (b - a for a, b in zip(clock, thread_clock()))
                self.profiles.append(prof)
            return outs
        finally:
            if pending is not None and pending.exception() is None:  # a layer raised: its next was read
                store.release(pending.result()[1])
            if act_bytes:
                self.budgets[act_tier].free(act_bytes)
            store.release(glob_staged)

    def _trim_after(self, j: int, prefill: bool) -> None:
        """Layer j's end: `release_heap` where `trims_heap_after` says, the free heap read through `heap`."""
        host = self._host_budget()
        if trims_heap_after(j, self.cfg.num_layers, prefill, host_budget=host,
                            free_heap=lambda: self.heap.free_bytes(host)):
            release_heap()

    def _host_budget(self) -> int:
        """The bytes the tiers in host memory are budgeted: the cpu tier's, the gpu tier's too where
        the compute device is the CPU."""
        host = self.budgets["cpu"].capacity_bytes
        return host + (self.budgets["gpu"].capacity_bytes if self.device.type == "cpu" else 0)

    def _activations(self, act_tier: str, steps: list[Step]) -> list[torch.Tensor]:
        """Each micro-batch's hidden states, views of one buffer on `act_tier` that every layer writes
        its output over: replaced by a fresh tensor a layer, each micro-batch's left a hole below the
        next in glibc's heap (the MoE job's prompt sweep, 16 micro-batches of 63 x 128 tokens: +31 MiB
        of free heap a micro-batch, ~0.5 GB by a layer's end, uncharged: OOM-killed under its cap)."""
        width = self.cfg.hidden_size
        sizes = [s.input_ids.numel() for s in steps]
        device = "cpu" if act_tier == "cpu" else self.device
        flat = torch.empty(sum(sizes) * width, dtype=self.dtype, device=device)
        return [v.view(*s.input_ids.shape, width) for v, s in zip(flat.split([n * width for n in sizes]), steps)]

    def _experts_ahead(self, prefill: bool, peak_limit) -> ExpertsAhead | None:
        """A decode sweep's reads ahead (`experts_ahead`), where the model has routed experts."""
        if prefill or not self.read_ahead or not self.weights.experts:
            return None
        if self._ahead is None:
            def place(layer: int, e: int) -> ExpertPlace:
                return expert_place(self._expert_places, self.weights.store, layer, e, self.weights.experts[layer][e])
            self._ahead = ExpertsAhead(self.weights, place, self.read_ahead_picks or self.cfg.moe.num_experts_per_token)
        self._ahead.begin_sweep(peak_limit)
        return self._ahead

    def _run_layer(self, j: int, fetched: dict, steps: list[Step], hidden: list, ctxs: list, cache,
                   twin_bytes: int, ahead: ExpertsAhead | None = None) -> None:
        """Layer j over every micro-batch (its output written over hidden[k]), its decompressed
        weights charged to the gpu tier meanwhile (`twin_bytes`: its 4-bit matrices' dense
        copies for the sweep, already charged; 0: dequantized per call)."""
        w, dense_bytes = self.weights.layer_weights(fetched)
        # each dense copy is made (and prepacked) on its first call (`Int4Twin.dense`)
        twin = (lambda m: Int4Twin(m) if isinstance(m, Int4Weight) else m) \
            if twin_bytes else (lambda m: m)
        w = {name: twin(m) for name, m in w.items()}
        loads = self._expert_loads(j, twin, ahead)
        if loads is not None:
            if j not in self._expert_names:
                self._expert_names[j] = local_expert_names(self.weights.experts[j], self.weights.local)
            w = loads.mapping(w, self.weights.local, self.routing_counter, self._expert_names[j])
        charged = 0
        try:  # inside models.linear: each call's copies (4-bit matrices dequantized, FP8 upcast), as the kinds say
            dense_bytes += self.charges.call_copies(j, max(s.input_ids.numel() for s in steps),
                                                    sweep_copies=bool(twin_bytes))
            self.budgets["gpu"].allocate(dense_bytes, f"layer {j} weights decompressed")
            charged = dense_bytes
            for k, s in enumerate(steps):
                ws = self._layer_step(j, w, s, hidden[k], ctxs[k], cache)
                if k + 1 < len(steps) and trims_heap_after(j, self.cfg.num_layers, s.input_ids.shape[1] > 1, ws):
                    release_heap()  # (not after the last: the layer's end trims)
        finally:
            if loads is not None:
                loads.finish()
                w.close()
                charged += loads.charged
            if ahead is not None:
                ahead.end_layer(j)
            self.budgets["gpu"].free(charged + twin_bytes)

    def _expert_loads(self, j: int, twin, ahead: ExpertsAhead | None = None) -> RoutedExpertLoads | None:
        """Layer j's routed experts, fetched as the forward reads them; None: it has none."""
        if j not in self.weights.experts:
            return None

        def convert(fetched):
            w, dense_bytes = self.weights.layer_weights(fetched)
            self.budgets["gpu"].allocate(dense_bytes, f"layer {j} experts decompressed")
            return {name: twin(m) for name, m in w.items()}, dense_bytes

        return RoutedExpertLoads(self.weights.store, self.weights.expert_cache, j, self.weights.experts[j], convert,
                                 self.policy.cpu_expert_tokens, self.weights.cpu_expert_reads, self.policy.expert_group,
                                 self._expert_places, self._experts_as_stored, ahead)

    def _reserve_int4_twins(self, j: int, steps: list[Step]) -> int:
        """When several of the sweep's calls take a 4-bit matrix's dense path (prompt chunks:
        `WeightKind.keeps_sweep_copy`), layer j's matrices are dequantized (and prepacked)
        once for all of them instead of once a call: the same values, so the same bits. Taken
        where the layer's whole need with them (`PlacementCharges.layer_need`: the next layer's
        staging included, which is why this runs before that prefetch) fits the gpu tier, as
        the dry run decides it; the planner reserves it. Returns the bytes charged (0: per call)."""
        shapes = _shapes(steps)
        need = self.charges.sweep_copies(j)
        if (not need or not self.charges.takes_sweep_copies(j, shapes)
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

    def _layer_step(self, j: int, w: dict, step: Step, x: torch.Tensor, ctx, cache) -> int:
        """Layer j over one micro-batch, its output written over its input `x` (`_activations`), its
        workspace charged to the gpu tier meanwhile; `ctx`: (the step's rotary tables, its
        `attend_fn` keywords), from `_sweep`. Returns the workspace it charged."""
        rope, attend_kwargs = ctx
        geometry = attend_kwargs.get("geometry")
        ws = self._workspace_bytes(step, geometry.span if geometry is not None else step.span)
        self.budgets["gpu"].allocate(ws, "compute workspace")
        try:
            x.copy_(self.fwd.layer(w, x.to(self.device), rope,
                                   cache.attend_fn(j, step.slots, step.write_positions, **attend_kwargs), j))
        finally:
            self.budgets["gpu"].free(ws)
        return ws

    def overlap_report(self) -> dict[str, float]:
        """Steady-state (all sweeps but the first) per-layer wall time vs max(I/O, compute)."""
        sweeps = self.profiles[1:] or self.profiles
        wall = sum(sum(p.layer_s) for p in sweeps)
        bound = sum(max(io, c) for p in sweeps for io, c in zip(p.io_s, p.compute_s))
        io = sum(sum(p.io_s) for p in sweeps)
        compute = sum(sum(p.compute_s) for p in sweeps)
        return {"sweeps": len(sweeps), "wall_s": wall, "io_s": io, "compute_s": compute,
                "max_io_compute_s": bound, "ratio": wall / bound if bound else float("nan")}


def _shapes(steps: list[Step]) -> list[tuple[int, int, int]]:
    """(rows, tokens, span) of each micro-batch: what `PlacementCharges` charges a sweep by."""
    return [(s.input_ids.shape[0], s.input_ids.shape[1], s.span) for s in steps]
