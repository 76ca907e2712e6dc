"""`StorageConfig`: how a checkpoint stores its weights, read from config.json with the shapes.

Format facts live on the model's description (`ModelConfig.storage`), so nothing past parsing
reads the raw dict for them: the stored dtype of the unquantized tensors, an FP8 checkpoint's
tile (`quant_method: fp8`, DeepSeek-V3's layout), MXFP4 experts (`quant_method: mxfp4`, gpt-oss) and the
multi-token-prediction layers stored past the ones run (DeepSeek-V3's, GLM-4.5's). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_HF_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
QUANT_METHODS = ("fp8", "mxfp4")
DEFAULT_FP8_BLOCK = (128, 128)


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    dtype: str = "bf16"  # the unquantized tensors' stored dtype ("fp32", "bf16", "fp16")
    fp8_block: tuple[int, int] | None = None  # an FP8 checkpoint's tile (one fp32 scale each); None: not FP8
    mxfp4: bool = False  # the routed experts' matrices in MXFP4 (gpt-oss)
    mtp_layers: int = 0  # multi-token-prediction layers stored after the last one run (unused to generate)

    @property
    def weight_format(self) -> str:
        """"fp8", "mxfp4" or "dense" (`placement.ModelSpec.weight_format`)."""
        return "fp8" if self.fp8_block is not None else "mxfp4" if self.mxfp4 else "dense"


def storage_from_hf(hf: dict[str, Any], default_dtype: str) -> StorageConfig:
    """The storage facts of a config.json; `default_dtype` where it names no dtype. Raises ValueError
    naming the field for a quantization method the engine does not read."""
    raw = hf.get("torch_dtype") or hf.get("dtype")
    dtype = _HF_DTYPES.get(str(raw), default_dtype)
    mtp = hf.get("num_nextn_predict_layers") or hf.get("num_mtp_layers") or 0  # GLM-4.5 names it either way
    if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
        raise ValueError(f"num_nextn_predict_layers / num_mtp_layers must be a count, got {mtp!r}")
    quant = hf.get("quantization_config") or {}
    method = quant.get("quant_method")
    if method is None:
        return StorageConfig(dtype=dtype, mtp_layers=mtp)
    if method not in QUANT_METHODS:
        raise ValueError(f"quantization_config.quant_method {method!r} is not supported (fp8 and mxfp4 are); "
                         "give the unquantized checkpoint")
    if method == "mxfp4":
        return StorageConfig(dtype=dtype, mxfp4=True, mtp_layers=mtp)
    block = quant.get("weight_block_size") or list(DEFAULT_FP8_BLOCK)
    if len(block) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
        raise ValueError(f"quantization_config.weight_block_size must be two positive integers, got {block!r}")
    return StorageConfig(dtype=dtype, fp8_block=(block[0], block[1]), mtp_layers=mtp)
