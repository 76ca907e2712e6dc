"""The probe of a MoE model's routed experts for the machine profile: FLOP/s of a layer's experts (gate, up,
SwiGLU, down, the weighted sum) on the tokens routed to each, per phase, through the engine's own loop over
them (`models.blocks.moe.routed_sum`), so the profile follows whatever that runs: on an AVX2 CPU a prompt's
tokens on bf16 experts multiply in fp32 (2.5-4x torch's bf16 GEMM at 16-64 rows), a decode's in the native
16-bit kernel where it loads; 4-bit experts on the engine's `Int4Weight`. The planner prices a MoE layer's
experts with these (`placement.HardwareSpec.expert_seconds`).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from flexlamps.engine.executors.stored_weights import INT4_GROUP
from flexlamps.hardware.int4_probes import PASSES, median_rates
from flexlamps.models.blocks.moe import routed_sum
from flexlamps.models.blocks.weight_kind import Phase
from flexlamps.models.moe_config import MoEConfig
from quant.int4_weight import Int4Weight, can_pack

# tokens one expert gets: a decode step's one to tens (batch x top-k over the experts it picks), a prompt
# chunk's tens to hundreds; the planner clamps beyond the ends
EXPERT_ROWS = {Phase.DECODE: (1, 4, 16, 64), Phase.PROMPT: (4, 16, 64, 256)}
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _experts(device: torch.device, hidden: int, width: int, dtype: torch.dtype, num_bytes: int,
             int4: bool) -> list[tuple]:
    """Distinct random experts (gate, up, down) of about `num_bytes` in all (one at least): beyond the
    caches, as a layer's experts are read; 4-bit ones as the engine stores them (`Int4Weight`)."""
    count = max(1, num_bytes // (3 * hidden * width * (dtype.itemsize if not int4 else 0.5)))
    gen = torch.Generator(device=device).manual_seed(0)

    def matrix(out: int, inp: int):
        w = (torch.randn(out, inp, generator=gen, device=device) / inp ** 0.5).to(dtype)
        return Int4Weight.quantize(w.float(), INT4_GROUP, dtype).kernel_only() if int4 else w

    return [(matrix(width, hidden), matrix(width, hidden), matrix(hidden, width)) for _ in range(int(count))]


def _sweep(experts: list[tuple], rows: int, phase: Phase, share_s: float,
           sync: Callable[[], None]) -> tuple[Callable[[], None], float]:
    """(one `routed_sum` over as many experts as a quarter of `share_s` affords, `rows` tokens routed
    to each, its FLOPs): many at a few rows, where reading the experts is the time; one where it is compute."""
    width, hidden = experts[0][0].shape
    dtype = getattr(experts[0][0], "dtype", torch.float32)
    device = experts[0][2].device

    def run_on(count: int) -> Callable[[], None]:
        w = {f"experts.{e}.{name}": m for e, mats in enumerate(experts[:count])
             for name, m in zip(("gate_proj", "up_proj", "down_proj"), mats)}
        cfg = MoEConfig(num_experts=count, num_experts_per_token=1, num_shared_experts=0,
                        moe_intermediate_size=width, moe_layers=(True,), router="softmax_topk")
        x = torch.randn(count * rows, hidden, device=device).to(dtype)
        indices = torch.arange(count * rows, device=device).div(rows, rounding_mode="floor").unsqueeze(1)
        weights = torch.ones(count * rows, 1, device=device)
        return lambda: routed_sum(w, x, weights, indices, cfg, phase)

    one = run_on(1)
    one()  # warm-up: kernels load, buffers grow
    start = time.perf_counter()
    one()
    sync()
    count = max(1, min(len(experts), int(share_s / 4 / max(time.perf_counter() - start, 1e-9))))
    return run_on(count), 2.0 * 3 * rows * hidden * width * count


def measure_expert_products(device: torch.device, hidden: int, width: int, num_bytes: int, budget_s: float,
                            dtypes: tuple[str, ...], *, int4: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """{phase: {dtype: {rows: FLOP/s}}} of a routed expert of `hidden` x `width` (Qwen3-30B-A3B: 2048
    x 768) on `rows` tokens for each of the phase's EXPERT_ROWS, the median of passes taking turns, over distinct
    experts of about `num_bytes` (`int4`: the engine's 4-bit experts, `dtypes` their activations')."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    slots = len(dtypes) * sum(len(rows) for rows in EXPERT_ROWS.values())
    share_s = budget_s / slots / PASSES
    table: dict[str, dict[str, dict[str, float]]] = {phase.value: {} for phase in Phase}
    for name in dtypes:
        if int4 and not all(can_pack(shape, INT4_GROUP, device) for shape in ((width, hidden), (hidden, width))):
            continue
        experts = _experts(device, hidden, width, _DTYPES[name], num_bytes, int4)
        for phase in Phase:
            probes = {rows: _sweep(experts, rows, phase, share_s, sync) for rows in EXPERT_ROWS[phase]}
            for run, _ in probes.values():
                run()  # warm-up
            sync()
            table[phase.value][name] = {str(rows): rate for rows, rate in median_rates(probes, share_s, sync).items()}
    return {phase: tables for phase, tables in table.items() if tables}

