"""How an MLA latent cache lays out a record: the values in the compute dtype (`PlainRecords`) or
ESS's FP8 layout (`quant.fp8.LatentRecords`); `record_formats` picks both formats of a model, for
the dense cache (caches/latent.py) and the offloaded one (caches/latent_offload.py) alike."""

from __future__ import annotations

import torch

from flexlamps.models.config import ModelConfig
from quant.fp8 import LatentRecords


class PlainRecords:
    """Records in the compute dtype: `width` values then `tail` values, side by side."""

    def __init__(self, width: int, tail: int, dtype: torch.dtype):
        self.width, self.tail = width, tail
        self.record_bytes = (width + tail) * torch.empty((), dtype=dtype).element_size()
        self.storage_dtype, self.record_len = dtype, width + tail  # a record's tensor form

    def pack(self, values: torch.Tensor, tail: torch.Tensor | None = None) -> torch.Tensor:
        return values if tail is None else torch.cat([values, tail], dim=-1)

    def unpack(self, records: torch.Tensor, dtype: torch.dtype):
        if not self.tail:
            return records, None
        return records[..., :self.width], records[..., self.width:]

    def entries(self, records: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The records themselves: values then tail, in the compute dtype already."""
        return records


def record_formats(cfg: ModelConfig, dtype: torch.dtype, fp8: bool):
    """(latent record format, indexer key format or None) for an MLA model."""
    m = cfg.mla
    if fp8:
        keys = LatentRecords(m.index_head_dim) if m.has_indexer else None
        return LatentRecords(m.kv_lora_rank, m.qk_rope_head_dim), keys
    keys = PlainRecords(m.index_head_dim, 0, dtype) if m.has_indexer else None
    return PlainRecords(m.kv_lora_rank, m.qk_rope_head_dim, dtype), keys
