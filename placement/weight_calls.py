"""How the engine runs a layer's weight calls, the rules time and memory share: 4-bit weights in place or
dequantized (once a call, or once a sweep), FP8 upcast per call, and a call's GEMM seconds."""

from placement.choice import Choice
from placement.model_spec import ModelSpec
from placement.specs import HardwareSpec


def int4_runs_in_place(hardware: HardwareSpec, dtype: str) -> bool:
    """Whether `hardware` multiplies 4-bit weights in place (a fused kernel) with `dtype`
    activations: it has a rate table for that dtype (measured by the profile, or a preset's)."""
    return bool(hardware.gpu_int4_gemm_flops_by_rows.get(dtype)) and hardware.int4_dense_from_rows > 0


def in_place_int4(choice: Choice, model: ModelSpec, rows: float) -> bool:
    """The engine's rule for a call of `rows` rows on 4-bit weights, used by time and memory
    alike: in place (the fused kernel, nothing dense held) under the engine's switch, in a
    16-bit dtype, where the machine has the kernel (`Choice.int4_kernel`)."""
    return (choice.compress_weight and choice.compression.num_bits == 4 and choice.int4_kernel
            and rows < choice.int4_in_place_below_rows and model.dtype in ("fp16", "bf16"))


def runs_fused_int4(choice: Choice, model: ModelSpec, hardware: HardwareSpec, rows: float) -> bool:
    """Whether the engine multiplies 4-bit weights in place on calls of `rows` rows (the fused
    kernel, priced from the machine's table), rather than dequantizing them for a dense GEMM."""
    return in_place_int4(choice, model, rows) and hardware.int4_gemm_seconds(model.dtype, rows, 1.0) is not None


def int4_twins(choice: Choice, calls: int, rows: float) -> bool:
    """Whether the engine dequantizes a layer's 4-bit matrices once for all of a sweep's calls
    (and holds them dense meanwhile: `dequantized_bytes`): two calls or more of at least
    `Choice.int4_in_place_below_rows` rows (the offload executor's `_reserve_int4_twins`)."""
    return (choice.compress_weight and choice.compression.num_bits == 4 and calls >= 2
            and rows >= choice.int4_in_place_below_rows)


def weight_dequant_passes(choice: Choice, calls: int, rows: float) -> int:
    """How often a layer's compressed weights are dequantized in a sweep of `calls` calls that
    take the dense path: 4-bit matrices once a call, unless held dense for the sweep
    (`int4_twins`); other compressions once a sweep (the engine expands them on arrival)."""
    if choice.compression.num_bits != 4 or int4_twins(choice, calls, rows):
        return 1
    return calls


def weight_dequant_rate(choice: Choice, hardware: HardwareSpec) -> float:
    """fp16 output bytes/s of decompressing the weights as the engine stores them."""
    return hardware.int4_dequant_bytes_per_s if choice.compression.num_bits == 4 else hardware.gpu_dequant_bytes_per_s


def call_gemm_s(choice: Choice, model: ModelSpec, hardware: HardwareSpec, rows: float, layer_flops: float,
                 head_flops: float, weight_bytes: float, head_bytes: float, decode: bool = False) -> float:
    """Seconds of one call's GEMMs over `rows` rows: the layer's matrices (`layer_flops` over
    `weight_bytes`, the head's share included) on the dense GEMM, or on the fused 4-bit kernel
    where the engine runs that, or on int8 codes where it runs 4-bit prompts so (the head's share,
    `head_flops` over `head_bytes`, stays dense); `decode`: a decode call (`HardwareSpec.gemm_seconds`)."""
    if runs_fused_int4(choice, model, hardware, rows):
        fused_s = hardware.int4_gemm_seconds(model.dtype, rows, layer_flops)
    elif choice.compress_weight and choice.compression.num_bits == 4 and model.dtype in ("fp16", "bf16"):
        fused_s = hardware.int4_prompt_seconds(model.dtype, rows, layer_flops)
    else:
        fused_s = None
    if fused_s is None:
        return hardware.gemm_seconds(model.dtype, rows, layer_flops + head_flops, weight_bytes, decode=decode)
    return fused_s + hardware.gemm_seconds(model.dtype, rows, head_flops, head_bytes, decode=decode)


def resident_delta_s(choice, model: ModelSpec, hardware: HardwareSpec, rows: float, flops: float,
                      weight_bytes: float, calls: int, decode: bool = False) -> float:
    """Seconds a layer's GEMMs change by (negative: saved) per unit of the weight fraction on
    the GPU tier, where the engine keeps weights resident in the GEMM's own layout; compressed
    weights are decompressed afresh every time and gain nothing. `flops`: per call of `rows`."""
    if choice.compress_weight:
        return 0.0
    resident = hardware.gemm_seconds(model.dtype, rows, flops, weight_bytes, resident=True, decode=decode)
    streamed = hardware.gemm_seconds(model.dtype, rows, flops, weight_bytes, decode=decode)
    return calls * (resident - streamed)


def fp8_upcast_s(choice: Choice, model: ModelSpec, hardware: HardwareSpec, stored_bytes: float) -> float:
    """Seconds one call spends upcasting the FP8 matrices it uses (`stored_bytes` of a layer as
    stored, vectors included): the engine upcasts each per call, at the dequantization rate."""
    if model.weight_format != "fp8" or choice.compress_weight:
        return 0.0
    vectors = model.vector_param_count() * model.dtype_bytes
    dense = (stored_bytes - vectors) * model.dtype_bytes / model.matrix_bytes_per_param
    return dequant_s(dense, model, hardware.gpu_dequant_bytes_per_s)


def dequant_s(dense_bytes: float, model: ModelSpec, fp16_bytes_per_s: float) -> float:
    """Seconds to decompress what is `dense_bytes` in the model's dtype; dequantization rates
    are counted in fp16 output bytes (2 per element) whatever the dtype."""
    return dense_bytes / model.dtype_bytes * 2 / fp16_bytes_per_s
