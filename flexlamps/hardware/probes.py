"""The probes that measure this machine for its `placement.HardwareSpec` (`machine.profile_machine` runs them).

Each probe runs its kernel until a small time budget is spent and reports the rate of the
median repetition: what a long run sustains on a shared machine, where the best repetition
overstates it (engine runs last seconds to hours and meet every slow moment). On a box
without CUDA the "gpu" tier is the CPU device: GPU FLOP/s are CPU FLOP/s, GPU<->CPU copies
are memcpys, and the GPU memory is a budget the caller chooses (default a quarter of RAM,
taken out of the CPU's).
"""

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from flexlamps.models.blocks.gated_deltanet import CHUNK, chunk_rule_with_boundaries
from flexlamps.models.blocks.linear import linear, pack
from flexlamps.models.blocks.weight_kind import Phase
from flexlamps.models.config import ModelConfig
from flexlamps.models.forward import forward_for
from flexlamps.models.weight_specs import weight_specs
from placement.model_spec import delta_rule_flops
from quant import engine_weight_config, quantize

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSizes:
    """How big each probe is; `quick` trades accuracy for a run of under a minute.

    `sweep_flops` bounds one sweep of the GEMM-by-rows and int8 probes at a row count (one set of
    the matrices at least) and `passes` is how many turns their row counts take: a sweep runs once
    per pass whatever the time budget, so at many rows these, not `seconds_per_probe`, set the
    time (a quick profile of a tiny model's matrices took 70-440 s under load with the full
    probe's 8 GFLOP sweeps in 3 passes). `delta_rule_rows`: sequences in the delta rule's probe (a
    call of 8 takes about a second on a loaded 2-core box, and a probe makes four)."""

    disk_file_bytes: int
    copy_bytes: int
    gemm_dim: int
    attention_context: int
    dequant_elements: int
    seconds_per_probe: float
    sweep_flops: float
    passes: int
    delta_rule_rows: int

    @classmethod
    def for_mode(cls, quick: bool) -> "ProbeSizes":
        if quick:
            return cls(disk_file_bytes=32 << 20, copy_bytes=32 << 20, gemm_dim=256,
                       attention_context=512, dequant_elements=1 << 20, seconds_per_probe=0.05,
                       sweep_flops=5e8, passes=1, delta_rule_rows=2)
        return cls(disk_file_bytes=256 << 20, copy_bytes=128 << 20, gemm_dim=2048,
                   attention_context=2048, dequant_elements=64 << 20, seconds_per_probe=0.4,
                   sweep_flops=8e9, passes=3, delta_rule_rows=8)

    @property
    def gemm_rows_bytes(self) -> int:
        """Distinct weights the GEMM-by-rows probe cycles through (beyond the caches)."""
        return 2 * self.copy_bytes


def _synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work before a timer stops (nothing on the CPU)."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _engine_dequant_dtype(device: torch.device) -> torch.dtype:
    """The dtype the offload engine decompresses weights to on `device` (fp32 on CPUs)."""
    return torch.float16 if device.type == "cuda" else torch.float32


def _quantized_matrices(device: torch.device, shapes) -> list:
    """Random matrices of the given (out, in) shapes, compressed as the engine stores weights."""
    config = engine_weight_config()
    return [quantize(torch.randn(o, i, device=device), config) for o, i in shapes]


def _matrix_cycle(shapes, itemsize: int, num_bytes: int) -> list[tuple[int, int]]:
    """`shapes` repeated until they hold `num_bytes` (2 matrices at least): distinct weights
    beyond the caches, so each call reads its matrix from memory as a model's layers do."""
    set_bytes = sum(o * i for o, i in shapes) * itemsize
    cycle = list(shapes) * max(1, -(-num_bytes // set_bytes))
    return cycle if len(cycle) > 1 else cycle * 2


GENERIC_SHAPES = ((2048, 1024),)


def probe_shapes(shapes, itemsize: int, num_bytes: int,
                 fallback=GENERIC_SHAPES) -> tuple[tuple[int, int], ...]:
    """The matrix shapes to probe: a model's own (`ModelSpec.layer_matrix_shapes`) when one
    layer's set fits the probe's `num_bytes`, else a generic layer-sized matrix. On CPUs small
    matrices run GEMMs well below a large one's rate (SmolLM2's 576-wide ones at 8 rows: 48
    vs 87 GFLOP/s for 2048x1024 on this project's 2-core box); big ones reach it."""
    if shapes and sum(o * i for o, i in shapes) * itemsize <= num_bytes:
        return tuple((int(o), int(i)) for o, i in shapes)
    return fallback


def gemm_probe_shapes(model_shapes, quick: bool) -> tuple[tuple[int, int], ...]:
    """The matrices `profile_machine` times GEMMs on for `model_shapes` (fp32 weights)."""
    return probe_shapes(model_shapes, 4, ProbeSizes.for_mode(quick).gemm_rows_bytes)


def _repetition_times(run: Callable[[], None], budget_s: float, sync: Callable[[], None],
                      at_least: int) -> list[float]:
    """Seconds of each repetition of `run` until `budget_s` is spent (`at_least` of them)."""
    times, spent = [], 0.0
    while spent < budget_s or len(times) < at_least:
        start = time.perf_counter()
        run()
        sync()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
    return times


def typical_rate(run: Callable[[], None], work: float, budget_s: float,
                  sync: Callable[[], None] = lambda: None) -> float:
    """`work` units per second of the median repetition of `run` within `budget_s` (3 at least)."""
    run()  # warm-up: allocations, kernel selection
    sync()
    return work / max(statistics.median(_repetition_times(run, budget_s, sync, 3)), 1e-9)


_DISK_READ_PASSES = 3


def measure_disk(folder: Path, num_bytes: int, file_bytes=(8 << 20,)) -> tuple[float, float]:
    """(read, write) bytes/s of the offload engine's disk traffic in `folder`.

    The engine keeps one file per tensor and reads a layer's tensors one by one, each a
    `preadv` then dropped from the page cache; so does this probe, over files of `file_bytes`
    (a model's tensor sizes, cycled to `num_bytes`). On this project's virtual disk that read
    0.4-0.8 GB/s where one large sequential file read 1-2 GB/s. Reads: the median of a few
    passes, the page cache dropped before each.
    """
    sizes = list(file_bytes) * max(1, -(-num_bytes // sum(file_bytes)))
    with tempfile.TemporaryDirectory(dir=folder, prefix=".flexlamps-disk-probe-") as tmp:
        paths = [Path(tmp) / f"{k}.bin" for k in range(len(sizes))]
        chunk = os.urandom(max(sizes))
        start = time.perf_counter()
        for path, size in zip(paths, sizes):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                done = 0
                while done < size:
                    done += os.write(fd, memoryview(chunk)[done:size])
                os.fsync(fd)
                # the pages are clean after fsync, so DONTNEED really evicts them
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        write_s = time.perf_counter() - start
        buffers = {size: bytearray(size) for size in set(sizes)}
        read_times = []
        for _ in range(_DISK_READ_PASSES):
            start = time.perf_counter()
            for path, size in zip(paths, sizes):
                fd = os.open(path, os.O_RDONLY)
                try:
                    view, done = memoryview(buffers[size]), 0
                    while done < size and (n := os.preadv(fd, [view[done:]], done)) > 0:
                        done += n
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            read_times.append(time.perf_counter() - start)
    total = sum(sizes)
    return total / statistics.median(read_times), total / write_s


def measure_copies(device: torch.device, num_bytes: int, budget_s: float) -> tuple[float, float]:
    """(cpu->gpu, gpu->cpu) bytes/s: pinned copies on CUDA, a plain memcpy on the CPU."""
    numel = num_bytes // 4
    if device.type == "cuda":
        host = torch.empty(numel, dtype=torch.float32, pin_memory=True)
        dev = torch.empty(numel, dtype=torch.float32, device=device)
        sync = torch.cuda.synchronize
        to_gpu = typical_rate(lambda: dev.copy_(host, non_blocking=True), num_bytes, budget_s, sync)
        to_cpu = typical_rate(lambda: host.copy_(dev, non_blocking=True), num_bytes, budget_s, sync)
        return to_gpu, to_cpu
    src, dst = torch.ones(numel), torch.empty(numel)
    rate = typical_rate(lambda: dst.copy_(src), num_bytes, budget_s)
    return rate, rate


READ_PROBE_BYTES = 512 << 20  # far past any last-level cache (16-32 MiB on this project's machines)
READ_PROBE_PASSES = 9


def measure_read_bandwidth(num_bytes: int = READ_PROBE_BYTES, passes: int = READ_PROBE_PASSES) -> float:
    """Bytes/s a reduction reads from CPU memory: the median of `passes` passes over a buffer far
    larger than the caches, after one warm-up pass (first-touch page faults). One best-of pass over a
    256 MiB buffer gave 12.7 GB/s in one run and 35.5 in the next on a shared box; the median of
    several passes stays within a few percent (scripts/bench_generate.py prints it)."""
    if passes < 1 or num_bytes < 4:
        raise ValueError(f"measure_read_bandwidth: passes {passes} and num_bytes {num_bytes} must be positive")
    x = torch.ones(num_bytes // 4, dtype=torch.float32)
    x.sum()
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / max(statistics.median(times), 1e-9)


def measure_device_bandwidth(device: torch.device, num_bytes: int, budget_s: float) -> float:
    """Bytes/s of a large device-to-device copy, counting both the read and the write."""
    src = torch.ones(num_bytes // 4, device=device)
    dst = torch.empty_like(src)
    sync = _synchronizer(device)
    return typical_rate(lambda: dst.copy_(src), 2 * num_bytes, budget_s, sync)


def measure_gemm(device: torch.device, max_dim: int, budget_s: float) -> dict[str, float]:
    """FLOP/s of a square matmul for each dtype, sized so one call fits the time budget.

    It runs the engine's own `linear` (oneDNN on the CPU), so the rate is the one layers get.
    Some dtypes are orders of magnitude slower on some devices (fp16 on most CPUs), so a
    128-wide probe first estimates the rate and the real probe grows up to `max_dim`.
    """
    sync = _synchronizer(device)
    rates = {}
    for name, dtype in _DTYPES.items():
        dim = 128
        while True:
            a = torch.randn(dim, dim, device=device).to(dtype)
            b = torch.randn(dim, dim, device=device).to(dtype)
            rate = typical_rate(lambda: linear(a, b), 2.0 * dim**3, budget_s / 4, sync)
            # the next size up must still run a call in under a tenth of the budget
            if dim >= max_dim or 2.0 * (2 * dim) ** 3 / rate > budget_s / 10:
                break
            dim *= 2
        rates[name] = rate
    return rates


GEMM_ROWS = (1, 8, 32, 128, 512, 2048)
DECODE_ROWS = (1, 8, 32, 128)  # a decode call's rows: the block's sequences (clamped beyond)


def measure_gemm_by_rows(device: torch.device, num_bytes: int, budget_s: float,
                         dtypes: tuple[str, ...], shapes=GENERIC_SHAPES, packed: bool = False,
                         phase: Phase = Phase.PROMPT, row_counts=GEMM_ROWS, sweep_flops: float = 8e9,
                         passes: int = 3) -> dict[str, dict[str, float]]:
    """GEMM FLOP/s of the engine's `linear` at each of `row_counts` rows, per dtype, on calls in
    `phase` (the engine may multiply decode rows with another kernel: `DECODE_ROWS`).

    Weights of the (out, in) `shapes` cycle through `num_bytes` of distinct matrices (beyond
    the caches), so small calls pay for reading their weights as a decode step does. The
    curve between the bandwidth-bound and compute-bound ends is what the planner
    interpolates. `packed`: the weights in the layout the engine keeps resident ones in
    (`models.linear.pack`). `sweep_flops` and `passes`: as `ProbeSizes` says.
    """
    sync = _synchronizer(device)
    table = {}
    for name in dtypes:
        dtype = _DTYPES[name]
        cycle = _matrix_cycle(shapes, dtype.itemsize, num_bytes)
        weights = [torch.randn(o, i, device=device).to(dtype) for o, i in cycle]
        if packed:
            weights = [pack(w) for w in weights]
        sweeps = {rows: _row_sweep(weights, cycle, shapes, rows, sweep_flops, dtype, phase) for rows in row_counts}
        for sweep, flops in sweeps.values():
            if flops <= sweep_flops:  # warm-up (kernel selection, first allocations) on one set of the shapes;
                sweep(len(shapes))  # a set past the bound computes for far longer than a first call's setup
        sync()
        # row counts take turns over several passes, so on a shared machine each median spans
        # its slow and fast spells (one probe's second sees just one of them)
        times = {rows: [] for rows in row_counts}
        for _ in range(passes):
            for rows, (sweep, _) in sweeps.items():
                times[rows] += _repetition_times(sweep, budget_s / len(row_counts) / passes, sync, 1)
        rates = [sweeps[rows][1] / statistics.median(times[rows]) for rows in row_counts]
        table[name] = {str(rows): rate for rows, rate in zip(row_counts, nondecreasing(rates))}
    return table


def _row_sweep(weights: list, cycle, shapes, rows: int, sweep_flops: float, dtype: torch.dtype,
               phase: Phase) -> tuple[Callable, float]:
    """(a sweep of `linear` calls of `rows` rows over a prefix of `weights` (of the (out, in) `cycle`), its
    FLOPs). Many rows are compute-bound: a few matrices measure them as well as all and keep the sweep
    under `sweep_flops`; always whole sets of the shapes, so every row count is timed on the same mix
    (small matrices run slower)."""
    device = weights[0].device
    inputs = {i: torch.randn(rows, i, device=device).to(dtype) for i in {i for _, i in cycle}}
    set_flops = sum(2.0 * rows * o * i for o, i in shapes)
    count = len(shapes) * max(1, int(sweep_flops // set_flops))
    used = [(inputs[i], w) for w, (o, i) in zip(weights[:count], cycle)]
    flops = sum(2.0 * rows * o * i for o, i in cycle[:len(used)])
    return (lambda upto=len(used): [linear(x, w, phase=phase) for x, w in used[:upto]]), flops


def nondecreasing(values: list[float]) -> list[float]:
    """The closest nondecreasing sequence in least squares (pool adjacent violators).

    A GEMM's FLOP/s does not fall as its rows grow (the same weights serve more tokens); a
    dip between neighbouring row counts is another process's noise, averaged out here."""
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def measure_layer_overhead(device: torch.device, budget_s: float) -> float:
    """Seconds a layer costs beyond its FLOPs and bytes: launches and host-side dispatch.

    A decode step of a model so narrow that its arithmetic is free, timed with two depths;
    the slope per layer is the fixed cost every layer pays on every micro-batch.
    """
    # one token attending to itself: the engine's attention (its fixed cost a call included, by dtype) is
    # `attention_probe`'s, priced apart (`HardwareSpec.gpu_attention_call_s`)
    def attend(q, k, v, opts=None):
        return v.repeat_interleave(q.shape[2] // v.shape[2], dim=2).reshape(q.shape[0], q.shape[1], -1)

    def step_seconds(num_layers: int) -> float:
        cfg = ModelConfig(arch="decoder", model_type="llama", vocab_size=64, hidden_size=32, num_layers=num_layers,
                          num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64, max_position=64)
        gen = torch.Generator().manual_seed(0)
        specs = weight_specs(cfg)
        weights = {s.name: torch.randn(s.shape, generator=gen).to(device) for s in specs}
        glob = {s.name: weights[s.name] for s in specs if s.layer is None}
        layers = [{s.local_name: pack(weights[s.name]) for s in specs if s.layer == i} for i in range(num_layers)]
        fwd, ids = forward_for(cfg), torch.zeros((1, 1), dtype=torch.long, device=device)

        @torch.inference_mode()
        def decode_step():
            ctx = fwd.step_context(ids, torch.float32)
            x = fwd.embed(glob, ids, ids)
            for i, w in enumerate(layers):
                x = fwd.layer(w, x, ctx, attend, i)
            return fwd.head(glob, x).float()

        return 1.0 / typical_rate(decode_step, 1.0, budget_s / 2, _synchronizer(device))

    shallow, deep = 2, 10
    return max(0.0, (step_seconds(deep) - step_seconds(shallow)) / (deep - shallow))


def measure_cpu_attention(context: int, budget_s: float) -> float:
    """FLOP/s of one decode step of attention over a cache in CPU memory (fp32 compute)."""
    batch, heads, head_dim = 8, 16, 128
    q = torch.randn(batch, heads, 1, head_dim)
    k = torch.randn(batch, heads, context, head_dim)
    v = torch.randn(batch, heads, context, head_dim)
    attend = torch.nn.functional.scaled_dot_product_attention
    return typical_rate(lambda: attend(q, k, v), 4.0 * batch * heads * head_dim * context, budget_s)


def measure_delta_rule(device: torch.device, budget_s: float, rows: int = 8) -> dict[str, float]:
    """FLOP/s (as placement.model_spec.delta_rule_flops counts them) of the gated delta rule as the
    engine runs it, `rows` rows of 16 value heads of 128 x 128 (Qwen3.5 / Qwen3-Next's head size):
    "decode", a one-token step (its open chunk padded to a chunk, the state update skipped), and
    "prompt", a 256-token step. Far below the GEMM rate: small batched products and solves."""
    heads, dim, prompt = 16, 128, 256
    gen = torch.Generator().manual_seed(0)

    def inputs(tokens: int):
        q, k = (torch.randn(rows, tokens, heads // 2, dim, generator=gen).to(device) for _ in range(2))
        v = torch.randn(rows, tokens, heads, dim, generator=gen).to(device)
        g, beta = -torch.rand(rows, tokens, heads, generator=gen), torch.rand(rows, tokens, heads, generator=gen)
        return q, k, v, g.to(device), beta.to(device)

    state = torch.zeros(rows, heads, dim, dim, device=device)
    keep = torch.zeros(rows, dtype=torch.long, device=device)
    one, many, sync = inputs(CHUNK), inputs(prompt), _synchronizer(device)
    per_head = {phase: delta_rule_flops(CHUNK, dim, dim, phase == "decode") for phase in ("decode", "prompt")}
    return {"decode": typical_rate(lambda: chunk_rule_with_boundaries(*one, state, keep),
                                    rows * heads * per_head["decode"], budget_s, sync),
            "prompt": typical_rate(lambda: chunk_rule_with_boundaries(*many, state, None),
                                    rows * prompt * heads * per_head["prompt"], budget_s, sync)}


def measure_dequant(device: torch.device, numel: int, budget_s: float, shapes=((1024, 1024),),
                    matrix_s: float = 0.0) -> float:
    """fp16-equivalent output bytes/s (2 per element) of the engine's 4-bit weight decompression,
    beyond the `matrix_s` seconds each matrix costs (`measure_dequant_matrix_s`, priced apart).

    Runs `quant`'s dequantizer on the layout the offload engine stores weights in (groups of
    32 along the input channels, 8-bit group parameters), in the dtype it computes in on that
    device, over a sweep of matrices of `shapes` (one layer's, or 8 generic ones) totalling
    `numel` elements with a fresh output each, as the engine decompresses layer after layer.
    One matrix decompressed again and again
    stays in cache and read 2-3x faster than a model's layers do.
    """
    cycle = _matrix_cycle(shapes, 1, numel)
    matrices = _quantized_matrices(device, cycle)
    dtype = _engine_dequant_dtype(device)
    sync = _synchronizer(device)
    per_layer = len(shapes) if len(shapes) > 1 else 8  # generic: a layer of 8 matrices

    def sweep():
        # a layer's matrices are all decompressed before it runs, and held until it is done:
        # 20-30% slower here than dropping each at once, whose buffer the next one reuses warm
        for first in range(0, len(matrices), per_layer):
            layer = [qt.dequantize(dtype=dtype) for qt in matrices[first:first + per_layer]]
            del layer

    sweep_s = 1.0 / typical_rate(sweep, 1.0, budget_s, sync)
    elements = sum(o * i for o, i in cycle)
    return 2.0 * elements / max(sweep_s - len(cycle) * matrix_s, 0.1 * sweep_s)


def measure_dequant_matrix_s(device: torch.device, budget_s: float) -> float:
    """Seconds one weight matrix's decompression costs beyond its elements (the intercept of
    time against size, from a small and a larger matrix, both hot in cache)."""
    dtype = _engine_dequant_dtype(device)
    sync = _synchronizer(device)
    small, large = 1 << 14, 1 << 20
    seconds = {}
    for numel in (small, large):
        qt, = _quantized_matrices(device, [(numel // 1024, 1024)])
        seconds[numel] = 1.0 / typical_rate(lambda: qt.dequantize(dtype=dtype), 1.0, budget_s / 2, sync)
    per_element = (seconds[large] - seconds[small]) / (large - small)
    return max(0.0, seconds[small] - small * per_element)
