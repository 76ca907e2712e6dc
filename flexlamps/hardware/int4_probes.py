"""Probes of the engine's 4-bit weights (`quant.int4_weight.Int4Weight`) for the machine profile:
the fused kernel's FLOP/s at the row counts where `models.linear` runs it, and the rate of
dequantizing them for the dense GEMM it runs on bigger calls. The planner prices 4-bit calls
with these (`placement.HardwareSpec.int4_gemm_seconds`), as the engine runs them.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from flexlamps.engine.executors.stored_weights import INT4_GROUP
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS, int8_kernel, linear
from flexlamps.kernels import int8_gemm
from quant.int4_weight import Int4Weight, can_pack

# the dtypes the fused kernel runs in on each device (`Int4Weight.can_run_fused`); 4-bit weights
# of other dtypes are always dequantized for the dense GEMM, which the planner prices without a table
_CPU_DTYPES = {"bf16": torch.bfloat16}
_CUDA_DTYPES = {"bf16": torch.bfloat16}  # quant.int4_weight.CUDA_KERNEL_DTYPES
PROBE_ROWS = (1, 8, 32, 64)
PROMPT_ROWS = (128, 512, 2048)  # calls on int8 codes (`models.linear.int8_product`) from INT4_DENSE_FROM_ROWS
PASSES = 3  # the probes take turns this many times: on a shared machine each median spans slow and fast spells


def _weights(device: torch.device, shapes, dtype: torch.dtype, num_bytes: int) -> list[Int4Weight]:
    """Random 4-bit matrices of `shapes` (those the kernel takes), repeated to about `num_bytes`
    of packed codes, as the offload engine keeps them on the device."""
    usable = [(o, i) for o, i in shapes if can_pack((o, i), INT4_GROUP, device)] or [(2048, 1024)]
    cycle = usable * max(2, -(-num_bytes // sum(o * i // 2 for o, i in usable)))
    weights = [Int4Weight.quantize(torch.randn(o, i, device=device), INT4_GROUP, dtype) for o, i in cycle]
    return [w.kernel_only() for w in weights]


def _times(run: Callable[[], None], budget_s: float, sync: Callable[[], None]) -> list[float]:
    times, spent = [], 0.0
    while spent < budget_s or not times:
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return times


def _fused_sweep(weights: list[Int4Weight], rows: int, budget_s: float, sync) -> tuple[Callable[[], None], float]:
    """(a sweep of `linear` calls of `rows` rows over a prefix of `weights`, its FLOPs): as many
    matrices as one call's time says the budget affords (the kernel is far slower in some dtypes)."""
    dtype, device = weights[0].dtype, weights[0].device
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], device=device, dtype=dtype) for w in weights}
    start = time.perf_counter()
    linear(inputs[weights[0].shape[1]], weights[0])
    sync()
    used = weights[:max(1, min(len(weights), int(budget_s / 4 / max(time.perf_counter() - start, 1e-9))))]
    flops = sum(2.0 * rows * w.shape[0] * w.shape[1] for w in used)
    return (lambda: [linear(inputs[w.shape[1]], w) for w in used]), flops


def measure_int4(device: torch.device, shapes, num_bytes: int, budget_s: float) -> tuple[dict, float]:
    """({dtype: {rows: FLOP/s}} of the fused kernel below INT4_DENSE_FROM_ROWS rows, fp16-equivalent
    output bytes/s of dequantizing a sweep of matrices) on `device`, through the engine's own
    `linear` and `Int4Weight.dequantize` (into one reused buffer, as `models.linear` does).
    Rates are medians over passes that take turns; the table is made nondecreasing by the caller."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtypes = _CUDA_DTYPES if device.type == "cuda" else _CPU_DTYPES
    rows_list = [r for r in PROBE_ROWS if r < INT4_DENSE_FROM_ROWS]
    share_s = budget_s / (len(rows_list) + 1) / PASSES
    table, dequant_rate = {}, 0.0
    for name, dtype in dtypes.items():
        weights = _weights(device, shapes, dtype, num_bytes)
        out = torch.empty(max(w.shape[0] * w.shape[1] for w in weights), dtype=dtype, device=device)
        probes = {rows: _fused_sweep(weights, rows, share_s, sync) for rows in rows_list}
        probes["dequant"] = ((lambda: [w.dequantize(dtype, out=out[:w.shape[0] * w.shape[1]].view(w.shape))
                                       for w in weights]),
                             2.0 * sum(w.shape[0] * w.shape[1] for w in weights))  # fp16 output bytes
        for run, _ in probes.values():
            run()  # warm-up
        rates = median_rates(probes, share_s, sync)
        dequant_rate = max(dequant_rate, rates.pop("dequant"))
        table[name] = {str(rows): rate for rows, rate in rates.items()}
    return table, dequant_rate


def measure_int8_prompts(shapes, num_bytes: int, budget_s: float, sweep_flops: float = 8e9,
                         passes: int = PASSES) -> dict:
    """{"bf16": {rows: FLOP/s}} of the int8 GEMM that 4-bit prompts run on (packed weights: the
    planner prices their packing as a dequantization), or {} where `models.linear` does not use it
    (not a CPU with the kernel). Medians over `passes` passes that take turns; a sweep runs whole sets
    of the shapes up to `sweep_flops` (one set at least): these rows are compute-bound."""
    kernel = int8_kernel()
    if kernel is None:
        return {}
    usable = [(o, i) for o, i in shapes if int8_gemm.takes_width(i)] or [(2048, 1024)]
    cycle = usable * max(1, -(-num_bytes // sum(o * i for o, i in usable)))
    packed = [kernel.pack(torch.randn(o, i, dtype=torch.bfloat16)) for o, i in cycle]
    share_s = budget_s / len(PROMPT_ROWS) / passes
    probes = {}
    for rows in PROMPT_ROWS:
        sets = max(1, int(sweep_flops // sum(2.0 * rows * o * i for o, i in usable)))
        used = packed[:sets * len(usable)]
        inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=torch.bfloat16) for w in used}
        probes[rows] = ((lambda inputs=inputs, used=used: [kernel.matmul(inputs[w.shape[1]], w) for w in used]),
                        sum(2.0 * rows * w.shape[0] * w.shape[1] for w in used))
    return {"bf16": {str(rows): rate for rows, rate in median_rates(probes, share_s, lambda: None, passes).items()}}


def median_rates(probes: dict, share_s: float, sync, passes: int = PASSES) -> dict:
    """{key: work / median time} of probes {key: (run, work)} timed in `passes` passes taking turns."""
    times = {key: [] for key in probes}
    for _ in range(passes):
        for key, (run, _) in probes.items():
            times[key] += _times(run, share_s, sync)
    return {key: work / statistics.median(times[key]) for key, (_, work) in probes.items()}
