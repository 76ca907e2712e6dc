"""Built-in models (as HF config.json subsets) and machines, looked up by forgiving names.

Hardware numbers other than FlexGen's T4 box are typical values from vendor sheets, derated
to what dense kernels reach in practice; measure your own box with `flexlamps profile`.
"""

import re

from placement.model_spec import ModelSpec
from placement.specs import EngineCapabilities, HardwareSpec

GiB = 1 << 30
GB = 10**9
TFLOPS = 1e12


def _opt(hidden: int, layers: int, heads: int) -> dict:
    return dict(model_type="opt", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, ffn_dim=4 * hidden, vocab_size=50272,
                max_position_embeddings=2048, torch_dtype="float16")


def _llama(hidden, layers, heads, kv_heads, ffn, vocab, dtype="float16", tie=False) -> dict:
    return dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads,
                intermediate_size=ffn, vocab_size=vocab, torch_dtype=dtype,
                tie_word_embeddings=tie)


_DEEPSEEK_V32_ATTN = dict(
    model_type="deepseek_v32", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, index_n_heads=64, index_head_dim=128, index_topk=2048,
    intermediate_size=18432, vocab_size=129280, torch_dtype="bfloat16")

MODEL_CONFIGS: dict[str, dict] = {
    "opt-6.7b": _opt(4096, 32, 32),
    "opt-30b": _opt(7168, 48, 56),
    "opt-66b": _opt(9216, 64, 72),
    "opt-175b": _opt(12288, 96, 96),
    "llama-2-7b": _llama(4096, 32, 32, 32, 11008, 32000),
    "llama-2-13b": _llama(5120, 40, 40, 40, 13824, 32000),
    "llama-2-70b": _llama(8192, 80, 64, 8, 28672, 32000),
    "llama-3-8b": _llama(4096, 32, 32, 8, 14336, 128256, "bfloat16"),
    "llama-3-70b": _llama(8192, 80, 64, 8, 28672, 128256, "bfloat16"),
    "smollm2-135m": _llama(576, 30, 9, 3, 1536, 49152, "bfloat16", tie=True),
    # DeepSeek-V3.2's MLA + lightning-indexer attention with a dense FFN in every layer
    # (its first three layers' shape): the attention/cache path without the MoE weights.
    "deepseek-v3.2-attn": _DEEPSEEK_V32_ATTN,
    "deepseek-v3.2": dict(_DEEPSEEK_V32_ATTN, n_routed_experts=256, num_experts_per_tok=8,
                          n_shared_experts=1, moe_intermediate_size=2048,
                          first_k_dense_replace=3),
    # as released: the same model in an FP8 checkpoint (128x128 tiles, fp32 scales)
    "deepseek-v3.2-exp": dict(_DEEPSEEK_V32_ATTN, n_routed_experts=256, num_experts_per_tok=8,
                              n_shared_experts=1, moe_intermediate_size=2048, first_k_dense_replace=3,
                              quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
}


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


def model_preset(name: str) -> ModelSpec:
    key = _normalize(name)
    key = {"llama-3.1-8b": "llama-3-8b", "meta-llama-3-8b": "llama-3-8b",
           "meta-llama-3-70b": "llama-3-70b"}.get(key, key)
    if key not in MODEL_CONFIGS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(MODEL_CONFIGS)}")
    return ModelSpec.from_hf_config(MODEL_CONFIGS[key], name=key)


def hardware_preset(name: str) -> HardwareSpec:
    key = name.strip().lower().replace("_", "-")
    key = _HARDWARE_ALIASES.get(key, key)
    if key not in HARDWARE_PRESETS:
        raise KeyError(f"unknown hardware preset {name!r}; known: {', '.join(HARDWARE_PRESETS)}")
    return HARDWARE_PRESETS[key]()
