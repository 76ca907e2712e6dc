"""Group-wise 4-bit (and 8-bit) compression of weights and the KV cache.

`quant.config` is torch-free so `placement` can size compressed tensors without torch;
everything else is loaded on first use (`quant.quantize` etc.), so `import quant` stays
cheap and torch-free. Must not import `flexlamps`, `offload` or `placement`.
"""
from __future__ import annotations

import importlib

from quant.config import KV_CACHE_DEFAULT, WEIGHT_DEFAULT, QuantConfig

# public name -> module that defines it (imported lazily: they need torch)
_LAZY = {
    "QTensor": "quant.qtensor",
    "quantize": "quant.groupwise",
    "dequantize": "quant.groupwise",
    "QuantizedKVBuffer": "quant.kv_buffer",
    "compress_state_dict": "quant.state_dict",
    "decompress_state_dict": "quant.state_dict",
    "is_linear_weight": "quant.state_dict",
    "get_weight_quantizer": "quant.backends",
    "QuantBackendUnavailable": "quant.backends",
    "WEIGHT_QUANTIZERS": "quant.backends",
}

__all__ = ["QuantConfig", "WEIGHT_DEFAULT", "KV_CACHE_DEFAULT", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'quant' has no attribute {name!r}")
