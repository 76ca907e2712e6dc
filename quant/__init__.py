"""Group-wise 4-bit (and 8-bit) compression of weights and the KV cache.

How the engine uses it:
- Weights, once at load: `compress_state_dict(weights, WEIGHT_DEFAULT)` turns every 2-D
  linear weight into a `QTensor` (0.281x its fp16 bytes at 4 bits, group 64); norms,
  biases and embeddings stay dense. A QTensor stays compressed on every tier
  (`.to(device)`, `.pin_memory()`, `to_tensors()` for safetensors on disk) and is
  decompressed on the compute device, one layer at a time, with
  `dequantize(qt, dtype, device, out=reused_buffer)`.
- Other backends: `get_weight_quantizer("groupwise4" | "groupwise8" | "nf4" | "fp4" | "none")`.
- KV cache (`quant.kv_rows`, one row per sequence, each with its own length): keys in
  `ChannelGroupedRows` (per channel over 32 tokens, `KV_KEYS_PER_CHANNEL`), values in
  `TokenGroupedRows` (along the head dim, `KV_CACHE_DEFAULT`); `write(slots, positions, new)`
  each step, `read(slots, span)` for attention. FlexGen's head-dim grouping for keys too costs
  SmolLM2 +14.9% perplexity (keys +16.3%, values +1.0%); per-channel keys about +2%.

`quant.config` is torch-free so `placement` can size compressed tensors without torch;
everything else is loaded on first use (`quant.quantize` etc.), so `import quant` stays
cheap and torch-free. Must not import `flexlamps`, `offload` or `placement`.
"""
from __future__ import annotations

import importlib

from quant.config import KV_CACHE_DEFAULT, KV_KEYS_PER_CHANNEL, WEIGHT_DEFAULT, QuantConfig, engine_weight_config

# public name -> module that defines it (imported lazily: they need torch)
_LAZY = {
    "QTensor": "quant.qtensor",
    "quantize": "quant.groupwise",
    "dequantize": "quant.groupwise",
    "TokenGroupedRows": "quant.kv_rows",
    "ChannelGroupedRows": "quant.kv_rows",
    "compress_state_dict": "quant.state_dict",
    "decompress_state_dict": "quant.state_dict",
    "is_linear_weight": "quant.state_dict",
    "get_weight_quantizer": "quant.backends",
    "QuantBackendUnavailable": "quant.backends",
    "WEIGHT_QUANTIZERS": "quant.backends",
}

__all__ = ["QuantConfig", "WEIGHT_DEFAULT", "KV_CACHE_DEFAULT", "KV_KEYS_PER_CHANNEL", "engine_weight_config", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'quant' has no attribute {name!r}")
