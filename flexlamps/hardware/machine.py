"""This machine as a `placement.HardwareSpec`: every probe run (the better of the thread counts on a
CPU) and its rates assembled; what `flexlamps profile` prints and `--policy auto` plans with.
"""

import shutil
import socket
from pathlib import Path
from typing import Callable

import psutil
import torch

from flexlamps.hardware.attention_probe import attention_steps, slope_rate
from flexlamps.hardware.expert_probes import measure_expert_products
from flexlamps.hardware.int4_probes import measure_int4, measure_int8_prompts
from flexlamps.hardware.probes import (DECODE_ROWS, GENERIC_SHAPES, ProbeSizes, gemm_probe_shapes, measure_copies,
                                       measure_cpu_attention, measure_delta_rule, measure_dequant,
                                       measure_dequant_matrix_s,
                                       measure_device_bandwidth, measure_disk, measure_gemm, measure_gemm_by_rows,
                                       measure_layer_overhead, nondecreasing, probe_shapes, typical_rate)
from flexlamps.host_allocator import keep_freed_memory
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS
from flexlamps.models.blocks.weight_kind import Phase
from placement import HardwareSpec


def _best_over_threads(probe: Callable[[], float | dict | tuple], pick=max):
    """Run a CPU probe with one thread and with torch's default; keep the faster result
    (`pick`: max for rates, min for times).

    On a loaded box, OpenMP's threads can wait on each other and run far slower than one
    thread; the engine can choose either, so the profile records what is reachable.
    """
    default = torch.get_num_threads()
    results = []
    for num_threads in sorted({1, default}):
        torch.set_num_threads(num_threads)
        try:
            results.append(probe())
        finally:
            torch.set_num_threads(default)
    return _pick_each(results, pick)


def _pick_each(results: list, pick):
    """Element-wise `pick` over results of one shape (numbers, or dicts/tuples of them, nested)."""
    first = results[0]
    if isinstance(first, dict):
        return {k: _pick_each([r[k] for r in results], pick) for k in first}
    if isinstance(first, tuple):
        return tuple(_pick_each([r[i] for r in results], pick) for i in range(len(first)))
    return pick(results)


def _gemm_peaks(on_cpu, device: torch.device, sizes: ProbeSizes, has_cuda: bool) -> tuple[dict, dict]:
    """Dense GEMM FLOP/s by dtype on the gpu tier's device and on the CPU (one probe on a
    CPU-only box, where the two are the same cores)."""
    gpu = on_cpu(lambda: measure_gemm(device, sizes.gemm_dim, sizes.seconds_per_probe))
    if not has_cuda:
        return gpu, gpu
    return gpu, _best_over_threads(lambda: measure_gemm(torch.device("cpu"), sizes.gemm_dim, sizes.seconds_per_probe))


def _int4_rates(on_cpu, device: torch.device, shapes, sizes: ProbeSizes, has_cuda: bool) -> tuple[dict, float, dict]:
    """The fused 4-bit kernel's FLOP/s by rows (made nondecreasing in rows, as the GEMM tables
    are), the 4-bit dequantization rate, and on a CPU the int8 GEMM's FLOP/s by rows (`_int8_rates`)."""
    table, dequant = on_cpu(lambda: measure_int4(device, shapes, sizes.gemm_rows_bytes // 16,
                                                 2 * sizes.seconds_per_probe))
    return _nondecreasing_tables(table), dequant, {} if has_cuda else _int8_rates(shapes, sizes)


def _int8_rates(shapes, sizes: ProbeSizes) -> dict:
    """The int8 GEMM's FLOP/s by rows for 4-bit prompts on this CPU (nondecreasing in rows), or {}."""
    return _nondecreasing_tables(_best_over_threads(
        lambda: measure_int8_prompts(shapes, sizes.gemm_rows_bytes // 4, 2 * sizes.seconds_per_probe,
                                     sizes.sweep_flops, sizes.passes)))


def _nondecreasing_tables(table: dict) -> dict:
    """{dtype: {rows: rate}} with each dtype's rates made nondecreasing in rows, as the GEMM tables are."""
    return {name: dict(zip(rows, nondecreasing(list(rows.values())))) for name, rows in table.items()}


def profile_machine(*, disk_folder: Path, quick: bool = False,
                    gpu_budget_bytes: int | None = None, model_shapes=None, expert_dims=None,
                    step: Callable[[str], None] = lambda name: None) -> HardwareSpec:
    """Run every probe and return the machine as a `HardwareSpec`.

    Args:
        disk_folder: where the disk probe writes its temporary file (the offload folder).
        quick: small probes with bounded sweeps (`ProbeSizes`), about 15-20 s on a quiet 2-core CPU.
        gpu_budget_bytes: GPU memory to plan with; default: the device's on CUDA, a quarter of RAM on a CPU.
        model_shapes: (out, in) of one layer's weight matrices (`ModelSpec.layer_matrix_shapes`)
            to time GEMMs and decompression on; default: a generic 2048x1024 matrix.
        expert_dims: a MoE model's routed experts' (hidden, width), to time its expert product on.
        step: called with each probe's name before it runs (progress display).
    """
    keep_freed_memory()  # the allocator the engine runs with (LLM sets it too)
    sizes = ProbeSizes.for_mode(quick)
    budget_s = sizes.seconds_per_probe
    has_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if has_cuda else "cpu")

    step("disk")
    disk_read, disk_write = _disk_rates(disk_folder, sizes, model_shapes, has_cuda)
    def on_cpu(probe, pick=max):  # the CPU is the device: keep its better thread count
        return probe() if has_cuda else _best_over_threads(probe, pick=pick)

    step("copies")
    to_gpu, to_cpu = on_cpu(lambda: measure_copies(device, sizes.copy_bytes, budget_s))
    step("memory bandwidth")
    gpu_bandwidth, cpu_bandwidth = _bandwidths(on_cpu, device, sizes.copy_bytes, budget_s)
    step("layer overhead")
    layer_overhead = on_cpu(lambda: measure_layer_overhead(device, budget_s), pick=min)
    step("gemm by rows")
    shapes = gemm_probe_shapes(model_shapes, quick)
    gemm_tables = _gemm_row_tables(on_cpu, device, sizes, shapes, has_cuda)
    # the decode roofline is what an 8-row fp32 GEMM streams (4 weight bytes per 2 FLOPs per
    # row); a memcpy only bounds it, and overstates it several times on a CPU
    gpu_bandwidth = min(gpu_bandwidth, gemm_tables["gpu_gemm_flops_by_rows"]["fp32"]["8"] * 4 / (2 * 8))
    step("gemm")
    gpu_gemm, cpu_gemm = _gemm_peaks(on_cpu, device, sizes, has_cuda)
    cpu_attention, delta_rule, attention = _attention_rates(on_cpu, device, sizes, step)
    step("dequantization")
    dequant_matrix_s, gpu_dequant, cpu_dequant = _dequant_rates(on_cpu, device, sizes, model_shapes, has_cuda)
    step("4-bit weights")
    int4_table, int4_dequant, int8_table = _int4_rates(on_cpu, device, shapes, sizes, has_cuda)
    gpu_mem, cpu_mem = _tier_memory(has_cuda, gpu_budget_bytes)
    return HardwareSpec(
        name=_profile_name(has_cuda, shapes),
        gpu_mem_bytes=int(gpu_mem), cpu_mem_bytes=int(cpu_mem),
        disk_bytes=int(shutil.disk_usage(disk_folder).free),
        cpu_to_gpu_bytes_per_s=to_gpu, gpu_to_cpu_bytes_per_s=to_cpu,
        disk_read_bytes_per_s=disk_read, disk_write_bytes_per_s=disk_write,
        gpu_matmul_flops_per_s=gpu_gemm, cpu_matmul_flops_per_s=cpu_gemm,
        gpu_mem_bytes_per_s=gpu_bandwidth, cpu_attention_flops_per_s=cpu_attention, cpu_mem_bytes_per_s=cpu_bandwidth,
        gpu_dequant_bytes_per_s=gpu_dequant, cpu_dequant_bytes_per_s=cpu_dequant,
        gpu_layer_overhead_s=layer_overhead, gpu_dequant_matrix_s=dequant_matrix_s,
        **gemm_tables, gpu_is_host=not has_cuda,
        gpu_int4_gemm_flops_by_rows=int4_table, int4_dense_from_rows=INT4_DENSE_FROM_ROWS,
        gpu_int4_dequant_bytes_per_s=int4_dequant, gpu_int8_prompt_flops_by_rows=int8_table,
        gpu_delta_rule_flops_per_s=delta_rule, **attention,
        **_expert_rates(on_cpu, device, sizes, expert_dims, has_cuda, step))


def _expert_rates(on_cpu, device: torch.device, sizes: ProbeSizes, expert_dims, has_cuda: bool,
                  step) -> dict[str, dict]:
    """HardwareSpec's MoE expert tables, {phase: {dtype: {rows: FLOP/s}}} as the engine multiplies
    plain and 4-bit experts (each made nondecreasing in rows); none without `expert_dims`."""
    if not expert_dims:
        return {}
    step("moe experts")
    hidden, width = expert_dims
    dtypes = ("fp32", "bf16", "fp16") if has_cuda else ("fp32", "bf16")
    budget_s = 4 * sizes.seconds_per_probe
    plain = on_cpu(lambda: measure_expert_products(device, hidden, width, sizes.gemm_rows_bytes, budget_s, dtypes))
    int4 = on_cpu(lambda: measure_expert_products(device, hidden, width, sizes.gemm_rows_bytes // 4, budget_s / 2,
                                                  ("bf16",), int4=True))
    return {"gpu_expert_flops_by_rows": {phase: _nondecreasing_tables(tables) for phase, tables in plain.items()},
            "gpu_int4_expert_flops_by_rows": {phase: _nondecreasing_tables(tables) for phase, tables in int4.items()}}


def _attention_rates(on_cpu, device: torch.device, sizes: ProbeSizes, step) -> tuple[float, dict, dict]:
    """(decode attention's FLOP/s on the CPU, a hybrid model's delta rule's FLOP/s on the device, the
    engine's attention on the device by phase and dtype: `gpu_attention_flops_per_s`)."""
    step("cpu attention")
    cpu_attention = _best_over_threads(lambda: measure_cpu_attention(sizes.attention_context, sizes.seconds_per_probe))
    step("delta rule")
    delta_rule = on_cpu(lambda: measure_delta_rule(device, sizes.seconds_per_probe, sizes.delta_rule_rows))
    step("attention")
    steps = attention_steps(device, ("fp32", "bf16", "fp16") if device.type == "cuda" else ("fp32", "bf16"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def rate(sizes_: list) -> tuple[float, float]:  # (slope, intercept) between the sizes' median seconds
        seconds = [1.0 / typical_rate(run, 1.0, sizes.seconds_per_probe / 2, sync) for run, _ in sizes_]
        return slope_rate(tuple(seconds), tuple(flops for _, flops in sizes_))
    # over thread counts each the larger: the faster slope, the dearer call (a CPU's decode runs 1 thread)
    fits = {phase: {dtype: on_cpu(lambda s=sizes_: rate(s)) for dtype, sizes_ in by_dtype.items()}
            for phase, by_dtype in steps.items()}
    return cpu_attention, delta_rule, {
        "gpu_attention_flops_per_s": {p: {d: f[0] for d, f in by_d.items()} for p, by_d in fits.items()},
        "gpu_attention_call_s": {p: {d: f[1] for d, f in by_d.items()} for p, by_d in fits.items()}}


def _bandwidths(on_cpu, device: torch.device, num_bytes: int, budget_s: float) -> tuple[float, float]:
    """(the device's memory bandwidth, the host's): beside a GPU the host's is what MoE experts
    computed where they live stream; 0 on a CPU-only box (the planner takes the device's, the same)."""
    gpu = on_cpu(lambda: measure_device_bandwidth(device, num_bytes, budget_s))
    if device.type != "cuda":
        return gpu, 0.0
    return gpu, _best_over_threads(lambda: measure_device_bandwidth(torch.device("cpu"), num_bytes, budget_s))


def _profile_name(has_cuda: bool, shapes) -> str:
    return (f"profile:{socket.gethostname()}" + ("" if has_cuda else " (cpu as gpu)")
            + (f", matrices {'/'.join(f'{o}x{i}' for o, i in shapes)}" if shapes != GENERIC_SHAPES else ""))


def _disk_rates(disk_folder: Path, sizes, model_shapes, has_cuda: bool) -> tuple[float, float]:
    """Read and write rates over the engine's tensor files: the model's matrices in its dtype
    (fp16 on GPUs, fp32 here)."""
    itemsize = 2 if has_cuda else 4
    file_shapes = probe_shapes(model_shapes, itemsize, sizes.disk_file_bytes)
    return measure_disk(disk_folder, sizes.disk_file_bytes, [o * i * itemsize for o, i in file_shapes])


def _gemm_row_tables(on_cpu, device: torch.device, sizes, shapes, has_cuda: bool) -> dict[str, dict]:
    """HardwareSpec's GEMM rates by row count on prompt calls: streamed weights, and (on CPUs, where
    resident weights are prepacked) resident ones; on GPUs packing is a no-op and the second table
    would repeat. On CPUs also bf16 decode calls, which the engine runs on another kernel where
    oneDNN has no 16-bit GEMM (`dense_gemm.half_product`)."""
    # fp16 GEMMs are emulated (and slow) on CPUs; engines there run fp32 or bf16
    row_dtypes = ("fp32", "bf16", "fp16") if has_cuda else ("fp32", "bf16")
    rows_budget_s = 2 * sizes.seconds_per_probe  # the planner's main input: twice a probe's time
    rows_bytes = sizes.gemm_rows_bytes
    bounds = {"sweep_flops": sizes.sweep_flops, "passes": sizes.passes}
    streamed = on_cpu(lambda: measure_gemm_by_rows(device, rows_bytes, rows_budget_s, row_dtypes, shapes, **bounds))
    if has_cuda:
        return {"gpu_gemm_flops_by_rows": streamed}
    resident = on_cpu(lambda: measure_gemm_by_rows(device, rows_bytes, rows_budget_s, row_dtypes, shapes, packed=True,
                                                   **bounds))
    decode = on_cpu(lambda: measure_gemm_by_rows(device, rows_bytes, rows_budget_s / 2, ("bf16",), shapes,
                                                 phase=Phase.DECODE, row_counts=DECODE_ROWS, **bounds))
    return {"gpu_gemm_flops_by_rows": streamed, "gpu_gemm_flops_by_rows_resident": resident,
            "gpu_gemm_flops_by_rows_decode": decode}


def _dequant_rates(on_cpu, device: torch.device, sizes, model_shapes, has_cuda: bool) -> tuple[float, float, float]:
    """(seconds per matrix, gpu bytes/s, cpu bytes/s) of decompression."""
    budget_s = sizes.seconds_per_probe
    matrix_s = on_cpu(lambda: measure_dequant_matrix_s(device, budget_s), pick=min)
    shapes = probe_shapes(model_shapes, 1, sizes.dequant_elements, fallback=((1024, 1024),))

    def rate(on: torch.device, per_matrix_s: float) -> float:
        return measure_dequant(on, sizes.dequant_elements, budget_s, shapes, per_matrix_s)

    gpu = on_cpu(lambda: rate(device, matrix_s))
    # the CPU decompresses cache (CPU attention), which has no per-matrix term
    cpu = _best_over_threads(lambda: rate(torch.device("cpu"), 0.0)) if has_cuda else gpu
    return matrix_s, gpu, cpu


def _tier_memory(has_cuda: bool, gpu_budget_bytes: int | None) -> tuple[int, int]:
    """(gpu, cpu) bytes to plan with: on a CPU-only box the "gpu" tier is carved out of RAM."""
    ram = psutil.virtual_memory().total
    if has_cuda:
        return gpu_budget_bytes or torch.cuda.mem_get_info()[1], ram
    gpu_mem = gpu_budget_bytes or ram // 4
    return gpu_mem, max(ram - gpu_mem, 1)


PROBE_NAMES = ("disk", "copies", "memory bandwidth", "layer overhead", "gemm by rows", "gemm", "cpu attention",
               "delta rule", "attention", "dequantization", "4-bit weights",
               "moe experts")  # the last for a MoE model only
