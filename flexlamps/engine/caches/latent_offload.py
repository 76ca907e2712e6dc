"""The MLA latent cache offloaded as ESS does it (DeepSeek-V3.2 models with an indexer).

- every token's latent record (latent + rotary key; ESS's 656 B FP8 layout with `fp8=True`)
  lives on the `cpu` tier, the full copy;
- the indexer keys live on the `gpu` tier: every decode step scores all of them;
- per layer a `gpu` pool of `pool_entries[layer]` records per slot (`LatentPool`, LRU),
  warmed after a prefill with the last prompt token's top-k selection (ESS's warm-up);
- a decode step selects its top-k with the indexer, stamps the pooled ones, and brings all
  slots' missing records over in one batched gather from the cpu tier; attention then runs
  over records gathered from the pool in position order, exactly the records the in-memory
  cache gathers, so the logits equal `DenseLatentCache`'s bit for bit;
- with `overlap=True` (ESS's overlap) the misses are copied in (`latent_copy.MissCopy`: on
  CUDA a copy stream from pinned staging, on the CPU a worker thread) while attention runs
  over the hits, then over the misses, the two merged by log-sum-exp: the same top-k picks and
  logits within fp32 rounding of the in-memory path (`OVERLAP_LOGIT_TOLERANCE`), not the bits;
  its pinned staging (CUDA: room for every row's whole top-k) is charged to the cpu tier.
Every table is charged to its tier's budget; staged prefill records and miss copies are
charged to the gpu budget while they exist. `stats` counts lookups, misses and bytes moved.
"""

from __future__ import annotations

import torch

from flexlamps.engine.caches.latent_copy import MissCopy
from flexlamps.engine.caches.latent_pool import LatentPool
from flexlamps.engine.caches.latent_records import record_formats
from flexlamps.models.blocks.mla import (MLAStep, index_scores, latent_attention, merge_partials, partial_attention,
                                  select_topk, topk_mask, visible_mask)
from flexlamps.models.config import ModelConfig
from offload.budget import TierBudget


# How far overlapped decoding's logits may move from the in-memory path's (fp32): the split
# attention's two softmax sums and their merge round differently; measured on the tests' tiny
# V3.2 model over 64 steps, every pool size: at most 6e-7 (the bound leaves 16x of room)
OVERLAP_LOGIT_TOLERANCE = 1e-5


class OffloadedLatentCache:
    packs_rows = False  # one sequence a row (the indexer's top-k is per sequence)
    rewinds = True  # a row may be fed again from an earlier position

    def __init__(self, cfg: ModelConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 budgets: dict[str, TierBudget], device: torch.device, pool_entries: list[int], *,
                 fp8: bool = False, overlap: bool = False):
        m = cfg.mla
        if m is None or not m.has_indexer:
            raise ValueError("an offloaded latent cache needs a sparse-attention MLA model (DeepSeek-V3.2, "
                             f"with an indexer); model_type {cfg.model_type!r} attends to every entry")
        if len(pool_entries) != cfg.num_layers:
            raise ValueError(f"pool_entries needs one size per layer ({cfg.num_layers}), got {len(pool_entries)}")
        need = min(m.index_topk, capacity)
        if min(pool_entries) < need:
            raise ValueError(f"every layer's pool must hold one step's working set ({need} entries), "
                             f"got {min(pool_entries)}")
        self.dtype, self.device, self.budgets = dtype, device, budgets
        self.capacity, self.num_slots = capacity, num_slots
        self.latent_format, self.key_format = record_formats(cfg, dtype, fp8)
        self._charged: list[tuple[str, int]] = []
        self._now = 0
        self.stats = {"lookups": [0] * cfg.num_layers, "misses": [0] * cfg.num_layers, "h2d_bytes": 0}
        self._copies = None
        try:
            self._allocate(cfg.num_layers, [min(p, capacity) for p in pool_entries])
            if overlap:
                self._copies = self._miss_copy(num_slots * need)
        except BaseException:
            self.release()
            raise

    def _miss_copy(self, max_records: int):
        """The overlapped mode's copier, its pinned staging (on CUDA) charged to the cpu tier."""
        lf = self.latent_format
        self._charge("cpu", MissCopy.staging_bytes(self.device, max_records, lf.record_bytes),
                     "pinned staging for the latent misses")
        return MissCopy(self.device, max_records, lf.record_len, lf.storage_dtype)

    def _charge(self, tier: str, nbytes: int, what: str) -> None:
        self.budgets[tier].allocate(nbytes, what)
        self._charged.append((tier, nbytes))

    def _allocate(self, num_layers: int, pool_entries: list[int]) -> None:
        lf, kf = self.latent_format, self.key_format
        pin = self.device.type == "cuda"
        self.entries, self.index_keys, self.pools = [], [], []
        for layer in range(num_layers):
            shape = (self.num_slots, self.capacity)
            self._charge("cpu", self.num_slots * self.capacity * lf.record_bytes, f"latent records layer {layer}")
            self.entries.append(torch.zeros((*shape, lf.record_len), dtype=lf.storage_dtype, pin_memory=pin))
            self._charge("gpu", self.num_slots * self.capacity * kf.record_bytes, f"indexer keys layer {layer}")
            self.index_keys.append(torch.zeros((*shape, kf.record_len), dtype=kf.storage_dtype, device=self.device))
            pool = LatentPool(self.num_slots, self.capacity, pool_entries[layer], lf.record_len,
                              lf.storage_dtype, self.device)
            self._charge("gpu", pool.nbytes, f"latent pool layer {layer} ({pool_entries[layer]} entries a slot)")
            self.pools.append(pool)

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self._charged)

    def release(self) -> None:
        for tier, n in self._charged:
            self.budgets[tier].free(n)
        self._charged = []
        self.entries, self.index_keys, self.pools = [], [], []
        if self._copies is not None:
            self._copies.close()
            self._copies = None

    def copy_prefix_from(self, src: "OffloadedLatentCache", length: int, slots: torch.Tensor) -> None:
        """Copy the first `length` positions of src's row 0 into each of `slots` (shared prefixes)."""
        for layer in range(len(self.entries)):
            self.entries[layer][slots, :length] = src.entries[layer][0, :length]
            self.index_keys[layer][slots.to(self.device), :length] = src.index_keys[layer][0, :length]
            for slot in slots.tolist():
                self.pools[layer].reset(slot)

    def attend_fn(self, layer: int, slots: torch.Tensor, positions: torch.Tensor):
        return lambda step: self.attend(layer, slots, positions, step)

    def _unpack(self, records: torch.Tensor):
        return self.latent_format.unpack(records, self.dtype)

    def _entries(self, records: torch.Tensor) -> torch.Tensor:
        """Records as `latent_attention` takes them: (..., R + r) in the compute dtype."""
        return self.latent_format.entries(records, self.dtype)

    def attend(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, step: MLAStep) -> torch.Tensor:
        self._now += 1
        new = self.latent_format.pack(step.latent, step.k_rope)  # (n, T, record) on the device
        slots_cpu, pos_cpu = slots.cpu(), positions.cpu()
        slots, positions = slots.to(self.device), positions.to(self.device)  # the step's may come on the CPU
        for slot in slots_cpu[pos_cpu[:, 0] == 0].tolist():
            self.pools[layer].reset(slot)  # a new sequence takes the slot
        self.entries[layer][slots_cpu[:, None], pos_cpu] = new.cpu()
        self._refresh_pooled(layer, slots, positions, new)
        self.index_keys[layer][slots[:, None], positions] = self.key_format.pack(step.index_k)
        span = int(pos_cpu.max()) + 1
        keys = self.key_format.unpack(self.index_keys[layer][slots, :span], self.dtype)[0]
        scores = index_scores(step, keys)
        visible = visible_mask(positions, span)
        if positions.shape[1] > 1:
            return self._prefill(layer, slots_cpu, positions, step, scores, visible, span)
        if self._copies is not None:
            return self._decode_overlapped(layer, slots_cpu, positions, step, scores, visible, new)
        return self._decode(layer, slots_cpu, positions, step, scores, visible, new)

    def _refresh_pooled(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, new) -> None:
        """Positions written again (a padded prefill's tail, then the real tokens) must not keep
        a stale pooled record."""
        pool = self.pools[layer]
        entries = pool.entries(slots, positions)
        pooled = entries >= 0
        if bool(pooled.any()):
            pool.records[slots[:, None].expand_as(positions)[pooled], entries[pooled]] = new[pooled]

    def _prefill(self, layer, slots_cpu, positions, step, scores, visible, span) -> torch.Tensor:
        """All of the span's records staged on the device (as the in-memory cache holds them),
        then the pool warmed with each row's last query's selection."""
        staged_bytes = len(slots_cpu) * span * self.latent_format.record_bytes
        self.budgets["gpu"].allocate(staged_bytes, f"latent records layer {layer} staged for a prefill")
        try:
            records = self.entries[layer][slots_cpu, :span].to(self.device)
            self.stats["h2d_bytes"] += staged_bytes
            out = latent_attention(step, self._entries(records), topk_mask(scores, visible, step.index_topk))
            indices, valid = select_topk(scores[:, -1:], visible[:, -1:], step.index_topk)
            slots = slots_cpu.to(self.device)
            miss_slots, miss_pos, entries = self.pools[layer].admit(slots, indices[:, 0], valid[:, 0], self._now)
            self.pools[layer].records[miss_slots, entries] = records[_row_of(slots)[miss_slots], miss_pos]
        finally:
            self.budgets["gpu"].free(staged_bytes)
        return out

    def _decode(self, layer, slots_cpu, positions, step, scores, visible, new) -> torch.Tensor:
        indices, valid = select_topk(scores, visible, step.index_topk)  # (n, 1, k), position order
        pool, slots = self.pools[layer], slots_cpu.to(self.device)
        miss_slots, miss_pos, entries = pool.admit(slots, indices[:, 0], valid[:, 0], self._now)
        self.stats["lookups"][layer] += int(valid.sum())
        self.stats["misses"][layer] += miss_pos.numel()
        self._copy_in(layer, miss_slots, miss_pos, entries)
        pooled = pool.entries(slots, indices[:, 0]).clamp_min(0)  # unselected slots: masked below
        gathered = pool.records[slots[:, None], pooled]  # (n, k, record)
        out = latent_attention(step, self._entries(gathered), valid)
        # the new tokens are on the device already: pool them for free where an entry is spare
        fresh_slots, _, fresh_entries = pool.offer(slots, positions, self._now)
        pool.records[fresh_slots, fresh_entries] = new[_row_of(slots)[fresh_slots], 0]
        return out

    def _decode_overlapped(self, layer, slots_cpu, positions, step, scores, visible, new) -> torch.Tensor:
        """`_decode` with the misses' copy overlapped with the attention over the hits."""
        indices, valid = select_topk(scores, visible, step.index_topk)  # (n, 1, k), position order
        pool, slots = self.pools[layer], slots_cpu.to(self.device)
        hit = valid[:, 0] & (pool.entries(slots, indices[:, 0]) >= 0)  # (n, k): pooled before this step
        miss_slots, miss_pos, entries = pool.admit(slots, indices[:, 0], valid[:, 0], self._now)
        self.stats["lookups"][layer] += int(valid.sum())
        self.stats["misses"][layer] += miss_pos.numel()
        nbytes = miss_pos.numel() * self.latent_format.record_bytes
        self.budgets["gpu"].allocate(nbytes, f"latent records layer {layer} copied in for a step")
        try:
            copy = self._copies.start(self.entries[layer], miss_slots.cpu(), miss_pos.cpu()) if nbytes else None
            parts = [self._attend_part(pool, slots, indices[:, 0], hit, step)]
            if copy is not None:
                pool.records[miss_slots, entries] = self._copies.wait(copy)
                self.stats["h2d_bytes"] += nbytes
                parts.append(self._attend_part(pool, slots, indices[:, 0], valid[:, 0] & ~hit, step))
        finally:
            self.budgets["gpu"].free(nbytes)
        out = merge_partials(parts, self.dtype)
        fresh_slots, _, fresh_entries = pool.offer(slots, positions, self._now)
        pool.records[fresh_slots, fresh_entries] = new[_row_of(slots)[fresh_slots], 0]
        return out

    def _attend_part(self, pool, slots, indices, part, step: MLAStep):
        """Partial attention over the selected entries in `part` (n, k), gathered from the pool
        compacted to the most any row has (each row's own in position order, then padding)."""
        width = max(int(part.sum(1).max()), 1)
        order = torch.sort((~part).to(torch.int8), dim=1, stable=True).indices[:, :width]  # part first
        keep = part.gather(1, order)  # (n, width)
        pooled = pool.entries(slots, indices.gather(1, order)).clamp_min(0)  # padding: masked below
        latent, k_rope = self._unpack(pool.records[slots[:, None], pooled])  # (n, width, ...)
        return partial_attention(step, latent, k_rope, keep[:, None, :])

    def _copy_in(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, entries: torch.Tensor) -> None:
        """All slots' missing records in one gather from the cpu tier and one copy to the device."""
        if positions.numel() == 0:
            return
        nbytes = positions.numel() * self.latent_format.record_bytes
        self.budgets["gpu"].allocate(nbytes, f"latent records layer {layer} copied in for a step")
        try:
            records = self.entries[layer][slots.cpu(), positions.cpu()].to(self.device)
            self.pools[layer].records[slots.to(self.device), entries] = records
            self.stats["h2d_bytes"] += nbytes
        finally:
            self.budgets["gpu"].free(nbytes)

    def hit_rate(self) -> list[float]:
        """Per layer, the share of selected entries found in the pool during decode."""
        return [1.0 - m / k if k else 1.0 for m, k in zip(self.stats["misses"], self.stats["lookups"])]


def _row_of(slots: torch.Tensor) -> torch.Tensor:
    """A table from slot number to its row in `slots` (the step's rows)."""
    table = torch.zeros(int(slots.max()) + 1, dtype=torch.long, device=slots.device)
    table[slots] = torch.arange(len(slots), device=slots.device)
    return table
