"""Compress a model's weights dict once at load time: `compress_state_dict`.

By default only 2-D linear weights are compressed (q/k/v/o, gate/up/down, fc1/fc2 ...):
norms and biases are tiny and precision-critical, and the token embedding is a gather
table (and usually tied to `lm_head`), so they stay dense. Pass `should_compress` to
change that. Knows tensor names only through that predicate's defaults; imports torch.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from quant.config import WEIGHT_DEFAULT, QuantConfig
from quant.groupwise import quantize
from quant.qtensor import QTensor

# Name fragments of 2-D weights that are not decoder linears, in HF and GGUF naming.
_DENSE_NAME_PARTS = ("embed", "embd", "norm", "lm_head", "wte", "wpe")
_DENSE_NAMES = ("output.weight",)  # GGUF's untied lm_head


def is_linear_weight(name: str, tensor: torch.Tensor) -> bool:
    """True for a 2-D floating `*.weight` that is not an embedding, norm or lm_head."""
    if tensor.dim() != 2 or not tensor.is_floating_point() or not name.endswith("weight"):
        return False
    lowered = name.lower()
    return lowered not in _DENSE_NAMES and not any(part in lowered for part in _DENSE_NAME_PARTS)


def compress_state_dict(
    weights: Mapping[str, torch.Tensor],
    config: QuantConfig = WEIGHT_DEFAULT,
    should_compress: Callable[[str, torch.Tensor], bool] = is_linear_weight,
    quantize_fn: Callable[[torch.Tensor], object] | None = None,
) -> dict[str, QTensor | torch.Tensor]:
    """Compress the selected tensors of `weights`; the rest pass through unchanged.

    Args:
        weights: name -> dense tensor.
        config: group-wise settings (FlexGen's weight default: 4 bits, group 64, dim 0).
        should_compress: `(name, tensor) -> bool`; defaults to `is_linear_weight`.
        quantize_fn: overrides `quantize(tensor, config)`, e.g. a bitsandbytes
            quantizer from `quant.backends`.
    Returns:
        name -> QTensor (or the backend's compressed object) for compressed entries,
        the original tensor otherwise; same key order.
    """
    compress = quantize_fn or (lambda tensor: quantize(tensor, config))
    return {name: compress(t) if should_compress(name, t) else t for name, t in weights.items()}


def decompress_state_dict(
    compressed: Mapping[str, object], dtype: torch.dtype | None = None, device=None
) -> dict[str, torch.Tensor]:
    """Dense copy of a `compress_state_dict` result (for checks and reference runs)."""
    dense = {}
    for name, value in compressed.items():
        if isinstance(value, torch.Tensor):
            dense[name] = value.to(device=device, dtype=dtype or value.dtype)
        else:
            dense[name] = value.dequantize(dtype=dtype, device=device)
    return dense


def state_dict_nbytes(weights: Mapping[str, object]) -> int:
    """Bytes held by a (possibly compressed) weights dict."""
    return sum(
        v.numel() * v.element_size() if isinstance(v, torch.Tensor) else v.nbytes for v in weights.values()
    )
