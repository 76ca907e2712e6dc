"""The recurrent-state cache kind: a fixed number of bytes per sequence, whatever its length, for
a hybrid model's gated-DeltaNet layers (see models.hybrid_config).

Per DeltaNet layer and row: the conv window (conv_dim x (kernel - 1), compute dtype), the
recurrent matrices at the row's last chunk boundary (value heads x key_head_dim x value_head_dim,
float32) and the tokens since that boundary (models.blocks.aligned_delta_rule.OpenChunk: at most
DELTA_RULE_CHUNK - 1 tokens' k | v | beta in the compute dtype and g in float32). Each layer lives on the
tier the policy gives it (charged to that tier's budget when budgets are given); a step's rows are
read onto the compute device (a cpu-tier layer's rows charged to the gpu tier meanwhile) and their
new states written back, the same values wherever they lived, so an offloaded run equals the
in-memory one bit for bit.

A state is the sum of everything its sequence has seen, so it cannot be rewound like a KV cache
row: each row records how many tokens its state holds, a step from position 0 starts the row anew
(zeros: a refilled row never sees its predecessor), and a step that neither starts nor continues
a row's state is an error rather than a silently wrong result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flexlamps.models.blocks.aligned_delta_rule import OpenChunk
from flexlamps.models.hybrid_config import DELTA_RULE_CHUNK, HybridConfig
from offload.budget import TierBudget


@dataclass(frozen=True)
class StateStepRows:
    """One step's rows as every DeltaNet layer of it sees them."""
    slots: torch.Tensor  # (n,) on the cpu
    fresh: torch.Tensor  # (n,) bool: the row starts a sequence (state zeros)
    lengths: torch.Tensor | None  # (n,) real tokens per row; None: all of the step's tokens
    held: torch.Tensor  # (n,) tokens the rows' states have seen before the step (0 when fresh)
    slot_range: tuple[int, int] | None = None  # (first, end) of consecutive increasing slots, else None

    @property
    def open_lengths(self) -> torch.Tensor:
        """Tokens each row holds past its last chunk boundary."""
        return self.held % DELTA_RULE_CHUNK


def state_layer_bytes(hy: HybridConfig, num_slots: int, dtype: torch.dtype) -> int:
    """Bytes one DeltaNet layer's state takes for `num_slots` rows."""
    return num_slots * hy.state_bytes_per_layer(torch.empty((), dtype=dtype).element_size())


class StateCache:
    def __init__(self, hy: HybridConfig, num_slots: int, dtype: torch.dtype, tiers: list[str],
                 device: torch.device | str = "cpu", budgets: dict[str, TierBudget] | None = None):
        """`tiers`: per DeltaNet layer "gpu" (the compute device) or "cpu"; `budgets`: charged per
        tier (None: charged nowhere, the in-memory executor's)."""
        if "disk" in tiers:
            raise ValueError("a recurrent state on disk is not supported; give the cache gpu or cpu memory")
        self.hy, self.num_slots, self.tiers = hy, num_slots, tiers
        self.device, self.budgets = torch.device(device), budgets
        self.held = torch.zeros(num_slots, dtype=torch.long)  # tokens each row's state has seen
        self.conv, self.recurrent, self.chunk_kvb, self.chunk_g, self._charged = [], [], [], [], []
        layer_bytes = state_layer_bytes(hy, num_slots, dtype)
        try:
            for i, tier in enumerate(tiers):
                if budgets is not None:  # charged before it is allocated
                    budgets[tier].allocate(layer_bytes, f"recurrent state, DeltaNet layer {i} ({tier})")
                    self._charged.append((tier, layer_bytes))
                home = self.device if tier == "gpu" else torch.device("cpu")
                self.conv.append(torch.zeros(num_slots, hy.conv_dim, hy.conv_kernel - 1, dtype=dtype, device=home))
                self.recurrent.append(torch.zeros(num_slots, hy.num_value_heads, hy.key_head_dim, hy.value_head_dim,
                                                  dtype=torch.float32, device=home))
                width = hy.key_dim + hy.value_dim + hy.num_value_heads
                self.chunk_kvb.append(torch.zeros(num_slots, DELTA_RULE_CHUNK - 1, width, dtype=dtype, device=home))
                self.chunk_g.append(torch.zeros(num_slots, DELTA_RULE_CHUNK - 1, hy.num_value_heads,
                                                dtype=torch.float32, device=home))
        except BaseException:
            self.release()
            raise

    @property
    def parts(self) -> tuple[list[torch.Tensor], ...]:
        """Per part of a state, its tensor per DeltaNet layer."""
        return self.conv, self.recurrent, self.chunk_kvb, self.chunk_g

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for part in self.parts for t in part)

    def release(self) -> None:
        for tier, n in self._charged:
            self.budgets[tier].free(n)
        self._charged, self.conv, self.recurrent, self.chunk_kvb, self.chunk_g = [], [], [], [], []

    def begin_step(self, slots: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor | None) -> StateStepRows:
        """Check that each row starts (position 0) or continues its state, and record what it
        will hold after the step; called once per step, before its layers."""
        slots, start = slots.cpu(), positions[:, 0].cpu()
        t = positions.shape[1]
        fresh = start == 0
        stale = ~fresh & (start != self.held[slots])
        if bool(stale.any()):
            i = int(stale.nonzero()[0, 0])
            raise ValueError(f"cache row {int(slots[i])} holds the recurrent state of {int(self.held[slots[i]])} "
                             f"tokens; a step from position {int(start[i])} can neither continue it nor start "
                             "anew (a DeltaNet state cannot be rewound: recompute from position 0)")
        fed = torch.full_like(start, t) if lengths is None else lengths.cpu().to(torch.long)
        held = torch.where(fresh, 0, self.held[slots])
        self.held[slots] = start + fed
        first = int(slots[0])
        span = (first, first + len(slots)) if slots.tolist() == list(range(first, first + len(slots))) else None
        return StateStepRows(slots, fresh, None if lengths is None else lengths.cpu(), held, span)

    def access(self, layer: int, rows: StateStepRows) -> "LayerStateAccess":
        return LayerStateAccess(self, layer, rows)

    def copy_prefix_from(self, src: "StateCache", length: int, slots: torch.Tensor) -> None:
        """Each of `slots` takes src's row 0, which must hold exactly `length` tokens (a shared
        prefix's state is copied at its end, never cut)."""
        if int(src.held[0]) != length:
            raise ValueError(f"a recurrent state holds {int(src.held[0])} tokens; it cannot serve as a prefix "
                             f"of {length} (states are copied at a prefix's end only)")
        for mine, theirs in zip(self.parts, src.parts):
            for layer in range(len(mine)):
                mine[layer][slots.to(mine[layer].device)] = theirs[layer][0].to(mine[layer].device)
        self.held[slots.cpu()] = length


class LayerStateAccess:
    """One DeltaNet layer's rows of one step (models.blocks.deltanet_layer.StateAccess)."""

    def __init__(self, cache: StateCache, layer: int, rows: StateStepRows):
        self.cache, self.layer, self.rows = cache, layer, rows
        self.lengths = rows.lengths
        self._staged = 0
        self._read: list[torch.Tensor | None] = [None] * len(cache.parts)  # the parts as read() handed them out

    def read(self) -> tuple[torch.Tensor, torch.Tensor, OpenChunk]:
        cache, dev = self.cache, self.cache.device
        conv = cache.conv[self.layer]
        slots = self.rows.slots.to(conv.device)
        if cache.tiers[self.layer] != "gpu" and cache.budgets is not None:  # staged while the layer runs
            self._staged = state_layer_bytes(cache.hy, len(slots), conv.dtype)
            cache.budgets["gpu"].allocate(self._staged, f"recurrent state of DeltaNet layer {self.layer}, staged")
        span = self.rows.slot_range
        # consecutive slots (a batch decoding together): views of the cache, not copies; the rule
        # never writes its inputs, and write() copies back only the parts that changed
        rows = [(part[self.layer][span[0]:span[1]] if span else part[self.layer][slots]).to(dev)
                for part in cache.parts]
        self._read = list(rows)  # as the cache holds them: a part handed back unchanged is not written
        if bool(self.rows.fresh.any()):  # rows that start a sequence read zeros (new tensors: written back)
            keep = ~self.rows.fresh.to(dev)
            rows = [torch.where(keep.view(-1, *[1] * (r.dim() - 1)), r, 0) for r in rows]
        conv_rows, rec, kvb, g = rows
        return conv_rows, rec, OpenChunk(kvb, g, self.rows.open_lengths.to(dev))

    def write(self, conv: torch.Tensor, recurrent: torch.Tensor, open_chunk: OpenChunk) -> None:
        """A part handed back as read (a decode leaves the boundary state as it was until its
        chunk completes) is not copied back: the cache holds it already."""
        cache = self.cache
        slots = self.rows.slots.to(cache.conv[self.layer].device)
        values = (conv, recurrent, open_chunk.kvb, open_chunk.g)
        for part, value, read in zip(cache.parts, values, self._read):
            if value is not read:
                home = part[self.layer]
                home[slots] = value.to(home.device, home.dtype)
        if self._staged:
            cache.budgets["gpu"].free(self._staged)
            self._staged = 0
