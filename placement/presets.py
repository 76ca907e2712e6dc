"""Built-in models (stored descriptions: `model_presets.json`, written by the families from the
config.json subsets in `flexlamps.models.presets`) and machines, looked up by forgiving names.

Hardware numbers other than FlexGen's T4 box are typical values from vendor sheets, derated
to what dense kernels reach in practice; measure your own box with `flexlamps profile`.
"""

import json
import re
from functools import lru_cache
from pathlib import Path

from placement.model_spec import ModelSpec
from placement.specs import EngineCapabilities, HardwareSpec

MODEL_PRESETS_PATH = Path(__file__).with_name("model_presets.json")
GiB = 1 << 30
GB = 10**9
TFLOPS = 1e12


def _t4_flexgen() -> HardwareSpec:
    # FlexGen's GCP box (paper §6 and experimental/cost_model.py): T4 16 GB, 208 GB CPU,
    # 1.5 TB disk. Bandwidths and FLOP/s are FlexGen's fitted constants: cpu->gpu 12.89 GiB/s,
    # gpu->cpu 0.97 GiB/s (cache stores), disk 0.473 GiB/s read / 0.746 GiB/s write,
    # prefill GEMM 21.24 TFLOP/s, CPU attention 0.0123 TFLOP/s. 15 GiB of GPU memory usable.
    # Not in FlexGen's model, fitted here to its published runs (prompt 512, output 32):
    # GPU memory bandwidth 224 GB/s (70% of the 320 GB/s spec) from OPT-6.7B all-GPU,
    # 25.26 tok/s; 4-bit dequantization 15 GB/s (unfused PyTorch ops), the best worst-case
    # fit to its three compressed runs (OPT-6.7B / 30B / 175B: 29.12 / 8.38 / 1.12 tok/s,
    # predicted within -19% / -3% / +22% for the exact published policies).
    # No fused 4-bit kernel: torch's needs compute capability 8.0 (a T4 is 7.5) and bf16, which
    # Turing lacks; 4-bit weights are dequantized for every call (time and memory alike).
    return HardwareSpec(
        name="t4-flexgen", gpu_mem_bytes=15 * GiB, cpu_mem_bytes=208 * GiB,
        disk_bytes=1500 * GiB,
        cpu_to_gpu_bytes_per_s=12.89 * GiB, gpu_to_cpu_bytes_per_s=0.97 * GiB,
        disk_read_bytes_per_s=0.473 * GiB, disk_write_bytes_per_s=0.746 * GiB,
        gpu_matmul_flops_per_s={"fp16": 21.24 * TFLOPS, "fp32": 8.1 * TFLOPS,
                                "bf16": 8.1 * TFLOPS},  # no bf16 tensor cores on Turing
        cpu_matmul_flops_per_s={"fp32": 1.0 * TFLOPS, "bf16": 0.5 * TFLOPS,
                                "fp16": 0.2 * TFLOPS},
        gpu_mem_bytes_per_s=224 * GB, cpu_attention_flops_per_s=0.0123 * TFLOPS,
        gpu_dequant_bytes_per_s=15 * GB, cpu_dequant_bytes_per_s=2 * GB)


# torch's fused 4-bit CUDA kernel (tinygemm, `_weight_int4pack_mm`): bf16 activations only, compute
# capability 8.0 and later (so not the T4). Its rate from gpt-fast's published benchmark
# (github.com/pytorch-labs/gpt-fast README: Llama-2-7B, batch 1, A100-80GB power-limited to
# 330 W): 4-bit G=32 runs 196.80 tok/s reading 862.69 GB/s, where the A100-80GB's spec is
# 2039 GB/s, so the kernel streams its codes at 42% of a GPU's spec bandwidth. At r rows it does
# 2r FLOP per weight of 0.5625 bytes (4 bits, and a bf16 scale and zero per group of 64: the
# engine's layout), up to the dense GEMM rate; from 128 rows the engine dequantizes instead.
INT4_KERNEL_BANDWIDTH_SHARE = 862.69 / 2039
INT4_BYTES_PER_WEIGHT = 0.5 + 4 / 64
INT4_PRESET_ROWS = (1, 8, 32, 64)


def _int4_kernel_rates(gpu_bw_gbs: float, bf16_tflops: float) -> dict[str, dict[str, float]]:
    """{"bf16": {rows: FLOP/s}} of the fused 4-bit kernel on a GPU of this bandwidth (see above)."""
    weights_per_s = INT4_KERNEL_BANDWIDTH_SHARE * gpu_bw_gbs * GB / INT4_BYTES_PER_WEIGHT
    return {"bf16": {str(r): min(2 * r * weights_per_s, bf16_tflops * TFLOPS) for r in INT4_PRESET_ROWS}}


def _consumer_or_dc(name, gpu_gib, gpu_bw_gbs, fp16_tflops, fp32_tflops, cpu_gib, pcie_gbs,
                    disk_read_gbs, disk_write_gbs, disk_gib, cpu_attn_gflops) -> HardwareSpec:
    # every GPU preset below is Ampere or later (compute capability >= 8.0): it has the kernel
    return HardwareSpec(
        name=name, gpu_mem_bytes=int(gpu_gib * GiB), cpu_mem_bytes=int(cpu_gib * GiB),
        disk_bytes=int(disk_gib * GiB),
        cpu_to_gpu_bytes_per_s=pcie_gbs * GB, gpu_to_cpu_bytes_per_s=pcie_gbs * GB,
        disk_read_bytes_per_s=disk_read_gbs * GB, disk_write_bytes_per_s=disk_write_gbs * GB,
        gpu_matmul_flops_per_s={"fp16": fp16_tflops * TFLOPS, "bf16": fp16_tflops * TFLOPS,
                                "fp32": fp32_tflops * TFLOPS},
        cpu_matmul_flops_per_s={"fp32": 2.0 * TFLOPS, "bf16": 1.0 * TFLOPS,
                                "fp16": 0.3 * TFLOPS},
        gpu_mem_bytes_per_s=0.75 * gpu_bw_gbs * GB, cpu_attention_flops_per_s=cpu_attn_gflops * 1e9,
        # unfused dequantization reaches ~1/20 of the memory bandwidth (as fitted on the T4)
        gpu_dequant_bytes_per_s=gpu_bw_gbs * GB / 20, cpu_dequant_bytes_per_s=4 * GB,
        gpu_int4_gemm_flops_by_rows=_int4_kernel_rates(gpu_bw_gbs, fp16_tflops),
        int4_dense_from_rows=EngineCapabilities().int4_in_place_below_rows)


HARDWARE_PRESETS = {
    "t4-flexgen": _t4_flexgen,
    # name, GPU GiB, GPU GB/s (spec; 75% is used), fp16 TFLOP/s, fp32 TFLOP/s (≈70% of peak), host GiB,
    # PCIe GB/s, disk read/write GB/s, disk GiB, CPU attention GFLOP/s (≈ DRAM GB/s)
    "rtx3090": lambda: _consumer_or_dc("rtx3090", 24, 936, 50, 25, 64, 20, 3.0, 2.0, 2000, 30),
    "rtx4090": lambda: _consumer_or_dc("rtx4090", 24, 1008, 110, 55, 128, 22, 5.0, 4.0, 2000, 50),
    "a100-40gb": lambda: _consumer_or_dc("a100-40gb", 40, 1555, 220, 14, 256, 22, 3.0, 2.0, 4000, 80),
    "a100-80gb": lambda: _consumer_or_dc("a100-80gb", 80, 2039, 220, 14, 512, 22, 3.0, 2.0, 4000, 80),
    "h100-80gb": lambda: _consumer_or_dc("h100-80gb", 80, 3350, 600, 45, 1024, 45, 6.0, 4.0, 8000, 120),
    "h200": lambda: _consumer_or_dc("h200", 131, 4800, 600, 45, 1536, 45, 6.0, 4.0, 8000, 120),
}
# each GPU preset's CUDA compute capability: what decides which 4-bit path the engine takes there
# (`quant.int4_weight`: torch's fused kernel from 8.0, bf16 activations only; else dequantize, then
# the dense GEMM), so the presets' rate tables price that path (a test keeps the two in step)
CUDA_CAPABILITY = {"t4-flexgen": (7, 5), "rtx3090": (8, 6), "rtx4090": (8, 9), "a100-40gb": (8, 0),
                   "a100-80gb": (8, 0), "h100-80gb": (9, 0), "h200": (9, 0)}
_HARDWARE_ALIASES = {"t4": "t4-flexgen", "flexgen-t4": "t4-flexgen", "gcp-t4": "t4-flexgen",
                     "3090": "rtx3090", "4090": "rtx4090", "a100": "a100-80gb",
                     "h100": "h100-80gb", "h200-141gb": "h200"}
_MODEL_ORGS = re.compile(r"^(facebook|meta-llama|huggingfacetb|deepseek-ai)/")


def _normalize(name: str) -> str:
    key = _MODEL_ORGS.sub("", name.strip().lower()).replace("_", "-")
    return key.replace("-instruct", "").replace("-hf", "")


@lru_cache(maxsize=1)
def _stored_models() -> dict[str, dict]:
    return json.loads(MODEL_PRESETS_PATH.read_text())


def model_presets() -> list[str]:
    return list(_stored_models())


def model_preset(name: str) -> ModelSpec:
    """A built-in model by name, e.g. "opt-30b", "Llama-3-8B", "deepseek-v3.2-attn"."""
    key = _normalize(name)
    key = {"llama-3.1-8b": "llama-3-8b", "meta-llama-3-8b": "llama-3-8b",
           "meta-llama-3-70b": "llama-3-70b"}.get(key, key)
    stored = _stored_models()
    if key not in stored:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(stored)}")
    return ModelSpec.from_dict(stored[key])


def hardware_preset(name: str) -> HardwareSpec:
    key = name.strip().lower().replace("_", "-")
    key = _HARDWARE_ALIASES.get(key, key)
    if key not in HARDWARE_PRESETS:
        raise KeyError(f"unknown hardware preset {name!r}; known: {', '.join(HARDWARE_PRESETS)}")
    return HARDWARE_PRESETS[key]()
