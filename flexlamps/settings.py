"""`RunSettings`: how a model runs, parsed once from the CLI's options or `LLM`'s arguments.

Byte sizes ("2GiB" or an int), dtype names, the weight compression backend and whether the
offload executor runs at all are decided here and nowhere else; the CLI builds one
`RunSettings` and hands it to `LLM.from_settings`, and `LLM(...)` builds the same object from
its keyword arguments. `AugmentedSettings` adds what the augmented face (agents) runs with: its
KV pools and its scheduler's iteration shape. Frozen: a run's settings do not change once
parsed. No torch import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from placement import parse_bytes

DTYPE_NAMES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}
WEIGHT_BACKENDS = ("groupwise4", "groupwise8", "nf4", "fp4", "none")


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    model: str = "smollm2-135m"  # a built-in name, a Hugging Face folder or a .gguf file
    # compute and weight dtype: float32, bfloat16, float16, or auto: bfloat16 with the blocks computed
    # in place for a quantized GGUF (Q4_0/Q4_1 4-bit, Q8_0 int8; SmolLM2's Q4_1 GGUF), else float32
    dtype: str = "auto"
    max_batch_size: int = 32  # sequences decoded together (offloaded: the policy's block instead)
    device: str | None = None  # the in-memory executor's device; None: the GPU when there is one
    reuse_prefix: bool = True  # compute a prefix shared by a call's prompts once
    gpu_mem: int | None = None  # gpu tier budget in bytes; None with offloading: a quarter of RAM
    cpu_mem: int | None = None  # cpu tier budget in bytes; None with offloading: half the available RAM
    offload_dir: str | None = None  # the disk tier's folder
    policy: object = "auto"  # "auto" | a policy JSON path | a placement.Policy | None (all on the gpu tier)
    compress_weight: bool | None = None  # None: as the policy says
    compress_cache: bool | None = None
    weight_quant: str | None = None  # groupwise4 | groupwise8 | nf4 | fp4 | none
    cache_dir: object = None  # packed-weight cache folder; None: $FLEXLAMPS_CACHE or ~/.cache/flexlamps; False: off

    @classmethod
    def parse(cls, model: str = "smollm2-135m", **raw) -> "RunSettings":
        """Settings from user-facing values; raises ValueError naming the bad one and the fix."""
        dtype = str(raw.pop("dtype", "auto"))
        if dtype.lower() not in DTYPE_NAMES:
            raise ValueError(f"dtype {dtype!r} is not supported; use one of auto, float32, bfloat16, float16")
        quant = raw.get("weight_quant")
        if quant is not None and quant not in WEIGHT_BACKENDS:
            raise ValueError(f"weight_quant {quant!r} is not one of {', '.join(WEIGHT_BACKENDS)}")
        if quant not in (None, "none"):
            raw["compress_weight"] = True  # a compression backend compresses the weights
        for name in ("gpu_mem", "cpu_mem"):
            raw[name] = _bytes(name, raw.get(name))
        settings = cls(model=str(model), dtype=DTYPE_NAMES[dtype.lower()], **raw)
        if settings.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {settings.max_batch_size}")
        return settings

    @property
    def offloaded(self) -> bool:
        """Whether the offload executor runs: a tier budget, a disk folder or compression asked for."""
        return (self.gpu_mem is not None or self.cpu_mem is not None or self.offload_dir is not None
                or bool(self.compress_weight) or bool(self.compress_cache))

    def resolve_dtype(self, reader=None):
        """The torch dtype; "auto" picks by `reader`'s checkpoint (see `dtype`)."""
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if getattr(reader, "has_quantized_weights", False) else torch.float32
        return getattr(torch, self.dtype)

    def with_budgets(self) -> "RunSettings":
        """The tier budgets filled in from this machine's memory where not given."""
        if self.gpu_mem is not None and self.cpu_mem is not None:
            return self
        import psutil

        memory = psutil.virtual_memory()
        return dataclasses.replace(self, gpu_mem=self.gpu_mem if self.gpu_mem is not None else memory.total // 4,
                                   cpu_mem=self.cpu_mem if self.cpu_mem is not None else memory.available // 2)


@dataclass(frozen=True, kw_only=True)
class AugmentedSettings:
    """The augmented face's settings: its paged pools and its scheduler's iterations."""
    max_context: int  # tokens a request reaches at most
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 16  # requests in one iteration at most
    max_num_batched_tokens: int = 256  # tokens in one iteration (longer prefills are chunked)
    noise_sigma: float = 0.0  # multiplicative noise on the oracle's predictions
    seed: int = 0  # of that noise
    # pools in bytes; None: room for 4 full contexts in memory, what the budgets leave when offloaded
    gpu_kv_mem: int | None = None
    cpu_swap_mem: int | None = None  # 0: no swapping

    @classmethod
    def parse(cls, **raw) -> "AugmentedSettings":
        """Settings from user-facing values ("24MiB" or an int for the pools); raises ValueError
        naming the bad one and the fix."""
        for name in ("gpu_kv_mem", "cpu_swap_mem"):
            raw[name] = _bytes(name, raw.get(name), zero_ok=name == "cpu_swap_mem")
        settings = cls(**raw)
        for name in ("max_context", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(settings, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(settings, name)}")
        if settings.max_context < 2:
            raise ValueError(f"max_context must be >= 2 tokens, got {settings.max_context}")
        return settings

    @property
    def swap(self) -> bool:
        """Whether paused requests' blocks may go to a swap pool on the cpu tier."""
        return self.cpu_swap_mem != 0


def _bytes(name: str, value, zero_ok: bool = False) -> int | None:
    if value is None or isinstance(value, int):
        return value

    if zero_ok and str(value).strip().lower() in ("0", "0b"):
        return 0
    try:
        return int(parse_bytes(value))
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
