"""A MoE layer's routed experts in the time terms: cpu-tier experts computed where they live, the reads the
expert cache serves, a disk that holds experts only, the GEMM rows an expert actually gets, and the
compute a decode step's routed disk reads cannot overlap."""

from placement.affine import Affine, W_CPU, W_DISK
from placement.choice import Choice
from placement.expert_compute import cpu_experts_seconds, expert_flops_per_token, tokens_per_expert
from placement.layer_sizes import LayerSizes
from placement.model_spec import ModelSpec
from placement.specs import HardwareSpec
from placement.weight_calls import call_gemm_s


def routed_rows_delta_s(choice: Choice, model: ModelSpec, hardware: HardwareSpec, rows: float, phase: str) -> float:
    """Seconds a call's routed-expert products take beyond what `call_gemm_s` charges them at the
    call's `rows`: each expert multiplies only the tokens routed to it (`tokens_per_expert`: one or
    two in a decode step), in `phase` ("prompt" or "decode"), at the rate the profile measured the
    engine's expert product at (`HardwareSpec.expert_seconds`: on AVX2 a prompt's bf16 experts
    multiply in fp32, 2.5-4x faster than the bf16 GEMM). Without that table, the dense GEMM's rate
    at the expert's rows (uncompressed weights; 4-bit experts then take the kernels' own rates)."""
    if not model.num_experts or rows <= 0:
        return 0.0
    flops = rows * model.num_experts_per_token * expert_flops_per_token(model) * model.moe_layer_share
    own = max(tokens_per_expert(model, rows), 1.0)
    int4 = choice.compress_weight and choice.compression.num_bits == 4
    measured = (None if choice.compress_weight and not int4
                else hardware.expert_seconds(phase, model.dtype, own, flops, int4=int4))
    decode = phase == "decode"
    if measured is not None:
        return measured - call_gemm_s(choice, model, hardware, rows, flops, 0.0, 0.0, 0.0, decode)
    if choice.compress_weight:
        return 0.0
    return (hardware.gemm_seconds(model.dtype, own, flops, 0.0, decode=decode)
            - hardware.gemm_seconds(model.dtype, rows, flops, 0.0, decode=decode))


def dequantized_tokens(choice: Choice, model: ModelSpec, hardware: HardwareSpec, phase: str, tokens: float) -> float:
    """The tokens whose routed experts the layer's 4-bit dequantization terms count (`tokens`), or 0
    where the profile's 4-bit expert table prices those experts whole in `phase` (their products with
    whatever the engine does to their codes, measured through its own loop): not charged twice."""
    whole = (model.num_experts and choice.compress_weight and choice.compression.num_bits == 4
             and hardware.gpu_int4_expert_flops_by_rows.get(phase, {}).get(model.dtype))
    return 0.0 if whole else tokens


def cpu_experts_in_place(choice, sz, model, hardware, calls_rows: tuple[int, float], num_tokens: float,
                          ctog: Affine, comp: Affine) -> None:
    """Beside a GPU, where the engine computes cpu-tier experts where they live (few tokens per
    expert, `placement.expert_compute`): their reads leave the copy and their work joins compute
    at the CPU's rates. On a CPU-only machine cpu-tier weights are used in place anyway."""
    calls, rows = calls_rows
    if (not model.num_experts or hardware.gpu_is_host
            or tokens_per_expert(model, rows) >= choice.cpu_expert_tokens):
        return
    ctog.add(-sz.experts_stored * model.expected_experts(num_tokens) / model.num_experts, W_CPU)
    comp.add(calls * cpu_experts_seconds(model, hardware, rows, sz.experts_stored), W_CPU)


def cached_expert_reads(choice, sz: LayerSizes, model: ModelSpec, hardware: HardwareSpec,
                         num_tokens: float) -> tuple[float, float]:
    """Bytes of a sweep's routed-expert reads (per unit of the cpu and of the disk fraction) the
    expert cache serves: `Choice.expert_hits` of those off disk, and beside a GPU of the copies off
    the cpu tier (never of cpu-tier experts computed where they live)."""
    if not (model.num_experts and choice.expert_hits):
        return 0.0, 0.0
    served = choice.expert_hits * sz.experts_stored * model.expected_experts(num_tokens) / model.num_experts
    copies_off_cpu = not hardware.gpu_is_host and tokens_per_expert(model, num_tokens) >= choice.cpu_expert_tokens
    return (served if copies_off_cpu else 0.0), served


def disk_streamed(choice, sz: LayerSizes, model: ModelSpec, experts: float, streamed: float) -> float:
    """Bytes a sweep reads per unit of the disk fraction: `streamed` (every kind of weight in its
    share), or with `Choice.disk_experts_only` routed experts only, each of the `experts` read as
    routed, less what the expert cache serves."""
    if not (choice.disk_experts_only and model.num_experts):
        return streamed
    return sz.weight_stored * experts / model.num_experts * (1 - choice.expert_hits)


def routed_reads_s(choice, sz: LayerSizes, model: ModelSpec, hardware: HardwareSpec, calls_rows: tuple[int, float],
                   experts: float, served: float, before_router: Affine) -> Affine:
    """Seconds from a decode layer's start until its routed experts read off disk are computed: the
    engine reads a routed expert only once the layer's router has named it, so those reads wait for
    the compute before the router (`before_router`: norms, attention, the dense products and the
    layer's share of the output head, during which the disk idles), and the last one read is
    computed after it lands (one expert's product at the call's rows, from the same rates `comp`
    prices every expert at); the experts at hand are computed while they are read. `experts`,
    `served`: the experts the layer reads and the disk bytes the expert cache serves (per unit of
    the disk fraction), as `dtoc` counts them. A dense model has none: 0."""
    calls, rows = calls_rows
    if not model.num_experts or rows <= 0:
        return Affine()
    read = disk_streamed(choice, sz, model, experts, sz.experts_stored * experts / model.num_experts - served)
    flops = rows * model.num_experts_per_token * expert_flops_per_token(model) * model.moe_layer_share
    experts_s = (call_gemm_s(choice, model, hardware, rows, flops, 0.0, 0.0, 0.0, decode=True)
                 + routed_rows_delta_s(choice, model, hardware, rows, "decode"))
    last_s = calls * experts_s / max(model.expected_experts(rows), 1.0)
    return Affine(last_s).plus(before_router).add(read / hardware.disk_read_bytes_per_s, W_DISK)
