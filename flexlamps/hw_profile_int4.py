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
from flexlamps.models.linear import INT4_DENSE_FROM_ROWS, linear
from quant.int4_weight import Int4Weight, can_pack

# the dtypes the fused kernel runs in on each device (`Int4Weight.can_run_fused`); 4-bit weights
# of other dtypes are always dequantized for the dense GEMM, which the planner prices without a table
_CPU_DTYPES = {"bf16": torch.bfloat16}
_CUDA_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PROBE_ROWS = (1, 8, 32, 64)


def _weights(device: torch.device, shapes, dtype: torch.dtype, num_bytes: int) -> list[Int4Weight]:
    """Random 4-bit matrices of `shapes` (those the kernel takes), repeated to about `num_bytes`
    of packed codes, as the offload engine keeps them on the device."""
    usable = [(o, i) for o, i in shapes if can_pack((o, i), INT4_GROUP, device)] or [(2048, 1024)]
    cycle = usable * max(2, -(-num_bytes // sum(o * i // 2 for o, i in usable)))
    weights = [Int4Weight.quantize(torch.randn(o, i, device=device), INT4_GROUP, dtype) for o, i in cycle]
    return [w.kernel_only() for w in weights]


def _median_s(run: Callable[[], None], budget_s: float, sync: Callable[[], None]) -> float:
    run()  # warm-up
    sync()
    times, spent = [], 0.0
    while spent < budget_s or len(times) < 3:
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return statistics.median(times)


def _fused_rate(weights: list[Int4Weight], rows: int, budget_s: float, sync) -> float:
    """FLOP/s of `linear` on calls of `rows` rows over (a prefix of) `weights`: as many as one
    call's time says a repetition can afford (the kernel is far slower in some dtypes)."""
    dtype, device = weights[0].dtype, weights[0].device
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], device=device, dtype=dtype) for w in weights}
    start = time.perf_counter()
    linear(inputs[weights[0].shape[1]], weights[0])
    sync()
    one_s = time.perf_counter() - start
    used = weights[:max(1, min(len(weights), int(budget_s / 4 / max(one_s, 1e-9))))]
    flops = sum(2.0 * rows * w.shape[0] * w.shape[1] for w in used)
    return flops / _median_s(lambda: [linear(inputs[w.shape[1]], w) for w in used], budget_s, sync)


def measure_int4(device: torch.device, shapes, num_bytes: int, budget_s: float) -> tuple[dict, float]:
    """({dtype: {rows: FLOP/s}} of the fused kernel below INT4_DENSE_FROM_ROWS rows, fp16-equivalent
    output bytes/s of dequantizing a sweep of matrices) on `device`, through the engine's own
    `linear` and `Int4Weight.dequantize` (into one reused buffer, as `models.linear` does)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtypes = _CUDA_DTYPES if device.type == "cuda" else _CPU_DTYPES
    rows_list = [r for r in PROBE_ROWS if r < INT4_DENSE_FROM_ROWS]
    table, dequant_rate = {}, 0.0
    for name, dtype in dtypes.items():
        weights = _weights(device, shapes, dtype, num_bytes)
        table[name] = {str(rows): _fused_rate(weights, rows, budget_s / (len(rows_list) + 1), sync)
                       for rows in rows_list}
        out = torch.empty(max(w.shape[0] * w.shape[1] for w in weights), dtype=dtype, device=device)
        elements = sum(w.shape[0] * w.shape[1] for w in weights)
        seconds = _median_s(lambda: [w.dequantize(dtype, out=out[:w.shape[0] * w.shape[1]].view(w.shape))
                                     for w in weights], budget_s / (len(rows_list) + 1), sync)
        dequant_rate = max(dequant_rate, 2.0 * elements / seconds)
    return table, dequant_rate
