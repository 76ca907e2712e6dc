"""Compressed KV cache rows: the one compressed-KV implementation the engine's caches use.

A cache layer is (slots, heads, capacity, head_dim): one row ("slot") per sequence, each with
its own length, written at its own positions and read up to a span. Two layouts, both 4-bit
with a step and a min per group (`KV_VALUES` and `KV_KEYS_PER_CHANNEL` in quant.config):

- `TokenGroupedRows` (values; FlexGen's layout for both): each token's head vector is split
  into groups along the head dim, so a new token is compressed alone.
- `ChannelGroupedRows` (keys, KIVI): grouping keys along the head dim lets a few outlier
  channels widen every token's group (SmolLM2: +14% WikiText perplexity at 4 bits). Grouped
  per channel over `G` consecutive tokens, each channel gets its own range. A block of G
  tokens can only be compressed once full, so each row keeps its newest `< G` tokens dense in
  a residual buffer. Writes append at the row's length; a write before it (a new sequence in
  the row, or decode overwriting the padding of a prefill group) first truncates the row there.
"""

from __future__ import annotations

import torch

from quant.config import KV_KEYS_PER_CHANNEL, QuantConfig
from quant.groupwise import quantize_grouped


def rows_of(cache: torch.Tensor, slots: torch.Tensor, span: int) -> torch.Tensor:
    """cache[slots, :, :span]: a view, no copy, when the slots are consecutive rows."""
    n = slots.shape[0]
    first = int(slots[0])
    if bool((slots == torch.arange(first, first + n, device=slots.device)).all()):
        return cache[first:first + n, :, :span]
    return cache[slots, :, :span]


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class TokenGroupedRows:
    """One layer's K or V as 4-bit codes + per-group step and min, per (slot, head, position)."""

    def __init__(self, shape, dtype: torch.dtype, device, config: QuantConfig, zeros=torch.zeros):
        """`zeros`: allocates the buffers (`torch.zeros`'s signature; a disk-tier layer's maps files)."""
        slots, heads, cap, d = shape
        if config.bits != 4 or d % 2:
            raise ValueError(f"compressed KV rows are 4-bit with an even head_dim; got {config.bits} bits, {d}")
        self.qcfg, self.d, self.dtype = config, d, dtype
        self.groups = -(-d // config.group_size)
        self.codes = zeros((slots, heads, cap, d // 2), dtype=torch.uint8, device=device)
        self.scales = zeros((slots, heads, cap, self.groups), dtype=dtype, device=device)
        self.mins = zeros((slots, heads, cap, self.groups), dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.codes, self.scales, self.mins)

    def write(self, slots: torch.Tensor, positions: torch.Tensor, new: torch.Tensor) -> None:
        """new: (n, T, heads, d) at positions (n, T)."""
        n, t, h, d = new.shape
        codes, step, mins = quantize_grouped(new.reshape(n * t * h, d, 1), self.qcfg)
        # row-local split halves: byte j of a head vector holds codes j and j + d/2
        codes = codes.reshape(n, t, h, d)
        self.codes[slots[:, None], :, positions] = codes[..., : d // 2] | (codes[..., d // 2:] << 4)
        self.scales[slots[:, None], :, positions] = step.reshape(n, t, h, self.groups).to(self.dtype)
        self.mins[slots[:, None], :, positions] = mins.reshape(n, t, h, self.groups).to(self.dtype)

    def read(self, slots: torch.Tensor, span: int) -> torch.Tensor:
        """(n, heads, span, d) values; positions past a row's length are left unspecified."""
        codes = rows_of(self.codes, slots, span)
        n, h, s, _ = codes.shape
        vals = torch.cat([codes & 15, codes >> 4], dim=-1).reshape(n, h, s, self.groups, -1)
        scales = rows_of(self.scales, slots, span)[..., None].float()
        mins = rows_of(self.mins, slots, span)[..., None].float()
        return (vals.float() * scales + mins).reshape(n, h, s, self.d).to(self.dtype)

    def copy_prefix_from(self, src: "TokenGroupedRows", length: int, slots: torch.Tensor) -> None:
        """The first `length` positions of src's row 0 into each of `slots` (shared prefixes)."""
        for dst, source in ((self.codes, src.codes), (self.scales, src.scales), (self.mins, src.mins)):
            dst[slots.to(dst.device), :, :length] = source[0, :, :length].to(dst.device)


class ChannelGroupedRows:
    """One layer's keys grouped per channel over `config.group_size` tokens (see the module)."""

    def __init__(self, shape, dtype: torch.dtype, device, config: QuantConfig = KV_KEYS_PER_CHANNEL,
                 zeros=torch.zeros):
        """`zeros`: allocates the buffers, as `TokenGroupedRows`'s."""
        slots, heads, cap, d = shape
        group = config.group_size
        if config.bits != 4 or group % 2:
            raise ValueError(f"per-channel keys are 4-bit with an even group size; got {config.bits}, {group}")
        self.g, self.d, self.dtype = group, d, dtype
        self.qcfg = config  # quantize_grouped groups along the G tokens of a (heads, G, d) block
        blocks = -(-cap // group)
        self.codes = zeros((slots, heads, blocks, group // 2, d), dtype=torch.uint8, device=device)
        self.scales = zeros((slots, heads, blocks, d), dtype=dtype, device=device)
        self.mins = zeros((slots, heads, blocks, d), dtype=dtype, device=device)
        self.residual = zeros((slots, heads, group, d), dtype=dtype, device=device)
        self.lengths = [0] * slots

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins, self.residual))

    def _compress(self, slot: int, block: int, tokens: torch.Tensor) -> None:
        """tokens: (heads, G, d) dense -> block `block` of row `slot`."""
        codes, step, mins = quantize_grouped(tokens, self.qcfg)  # grouped along dim 1 (the G tokens)
        half = self.g // 2
        self.codes[slot, :, block] = codes[:, :half] | (codes[:, half:] << 4)
        self.scales[slot, :, block] = step.reshape(tokens.shape[0], self.d).to(self.dtype)
        self.mins[slot, :, block] = mins.reshape(tokens.shape[0], self.d).to(self.dtype)

    def _block(self, slot: int, block: int) -> torch.Tensor:
        c = self.codes[slot, :, block]
        vals = torch.cat([c & 15, c >> 4], dim=1).float()
        return (vals * self.scales[slot, :, block, None].float() + self.mins[slot, :, block, None].float()).to(self.dtype)

    def _truncate(self, slot: int, length: int) -> None:
        cur = self.lengths[slot]
        if length >= cur:
            return
        block, keep = divmod(length, self.g)
        if keep and block < cur // self.g:  # cutting into a compressed block: reopen it
            self.residual[slot, :, :keep] = self._block(slot, block)[:, :keep]
        self.lengths[slot] = length

    def write(self, slots: torch.Tensor, positions: torch.Tensor, new: torch.Tensor) -> None:
        """new: (n, T, heads, d) at positions (n, T), each row contiguous and increasing."""
        g = self.g
        for r, slot in enumerate(slots.tolist()):
            p0 = int(positions[r, 0])
            self._truncate(slot, p0)
            if self.lengths[slot] != p0:
                raise ValueError(f"cache row {slot} holds {self.lengths[slot]} tokens; cannot write at {p0}")
            data = new[r].transpose(0, 1)  # (heads, T, d)
            taken, total = 0, data.shape[1]
            while taken < total:
                length = self.lengths[slot]
                fill = length % g
                count = min(g - fill, total - taken)
                self.residual[slot, :, fill:fill + count] = data[:, taken:taken + count]
                taken += count
                self.lengths[slot] = length + count
                if (length + count) % g == 0:
                    self._compress(slot, (length + count) // g - 1, self.residual[slot])

    def read(self, slots: torch.Tensor, span: int) -> torch.Tensor:
        """(n, heads, span, d) keys; positions past a row's length are left unspecified."""
        n = len(slots)
        blocks = -(-span // self.g)
        c = self.codes[slots, :, :blocks]  # (n, h, B, G/2, d)
        vals = torch.cat([c & 15, c >> 4], dim=3).float()
        out = vals * self.scales[slots, :, :blocks, None].float() + self.mins[slots, :, :blocks, None].float()
        out = out.to(self.dtype).reshape(n, c.shape[1], blocks * self.g, self.d)
        for r, slot in enumerate(slots.tolist()):
            length = self.lengths[slot]
            start = length // self.g * self.g
            if start < span and length > start:
                stop = min(length, span)
                out[r, :, start:stop] = self.residual[slot, :, : stop - start]
        return out[:, :, :span]

    def copy_prefix_from(self, src: "ChannelGroupedRows", length: int, slots: torch.Tensor) -> None:
        full, rest = divmod(length, self.g)
        for slot in slots.tolist():
            self.codes[slot, :, :full] = src.codes[0, :, :full]
            self.scales[slot, :, :full] = src.scales[0, :, :full]
            self.mins[slot, :, :full] = src.mins[0, :, :full]
            if rest:  # src row 0 holds >= length tokens: its block `full` is either compressed or residual
                part = src._block(0, full) if src.lengths[0] >= (full + 1) * self.g else src.residual[0]
                self.residual[slot, :, :rest] = part[:, :rest]
            self.lengths[slot] = length
