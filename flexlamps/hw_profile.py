"""Measure this machine into a `placement.HardwareSpec` (what `flexlamps profile` runs).

Each probe runs its kernel until a small time budget is spent and reports the rate of the
median repetition: what a long run sustains on a shared machine, where the best repetition
overstates it (engine runs last seconds to hours and meet every slow moment). On a box
without CUDA the "gpu" tier is the CPU device: GPU FLOP/s are CPU FLOP/s, GPU<->CPU copies
are memcpys, and the GPU memory is a budget the caller chooses (default a quarter of RAM,
taken out of the CPU's).
"""

import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil
import torch

from flexlamps.host_allocator import keep_freed_memory
from flexlamps.cache_folder import cache_root
from flexlamps.hw_profile_int4 import measure_int4, measure_int8_prompts
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS, linear, pack
from placement import HardwareSpec

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeSizes:
    """How big each probe is; `quick` trades accuracy for a run of a few seconds."""

    disk_file_bytes: int
    copy_bytes: int
    gemm_dim: int
    attention_context: int
    dequant_elements: int
    seconds_per_probe: float

    @classmethod
    def for_mode(cls, quick: bool) -> "ProbeSizes":
        if quick:
            return cls(disk_file_bytes=32 << 20, copy_bytes=32 << 20, gemm_dim=256,
                       attention_context=512, dequant_elements=1 << 20, seconds_per_probe=0.05)
        return cls(disk_file_bytes=256 << 20, copy_bytes=128 << 20, gemm_dim=2048,
                   attention_context=2048, dequant_elements=64 << 20, seconds_per_probe=0.4)

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
    from quant import engine_weight_config, quantize

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


def _typical_rate(run: Callable[[], None], work: float, budget_s: float,
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
        to_gpu = _typical_rate(lambda: dev.copy_(host, non_blocking=True), num_bytes, budget_s, sync)
        to_cpu = _typical_rate(lambda: host.copy_(dev, non_blocking=True), num_bytes, budget_s, sync)
        return to_gpu, to_cpu
    src, dst = torch.ones(numel), torch.empty(numel)
    rate = _typical_rate(lambda: dst.copy_(src), num_bytes, budget_s)
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
    return _typical_rate(lambda: dst.copy_(src), 2 * num_bytes, budget_s, sync)


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
            rate = _typical_rate(lambda: linear(a, b), 2.0 * dim**3, budget_s / 4, sync)
            # the next size up must still run a call in under a tenth of the budget
            if dim >= max_dim or 2.0 * (2 * dim) ** 3 / rate > budget_s / 10:
                break
            dim *= 2
        rates[name] = rate
    return rates


GEMM_ROWS = (1, 8, 32, 128, 512, 2048)
_SWEEP_FLOPS = 8e9  # per sweep of the GEMM-by-rows probe, at most (2 matrices at least)
_GEMM_PASSES = 3


def measure_gemm_by_rows(device: torch.device, num_bytes: int, budget_s: float,
                         dtypes: tuple[str, ...], shapes=GENERIC_SHAPES,
                         packed: bool = False) -> dict[str, dict[str, float]]:
    """GEMM FLOP/s of the engine's `linear` at each row count in GEMM_ROWS, per dtype.

    Weights of the (out, in) `shapes` cycle through `num_bytes` of distinct matrices (beyond
    the caches), so small calls pay for reading their weights as a decode step does. The
    curve between the bandwidth-bound and compute-bound ends is what the planner
    interpolates. `packed`: the weights in the layout the engine keeps resident ones in
    (`models.linear.pack`).
    """
    sync = _synchronizer(device)
    table = {}
    for name in dtypes:
        dtype = _DTYPES[name]
        cycle = _matrix_cycle(shapes, dtype.itemsize, num_bytes)
        weights = [torch.randn(o, i, device=device).to(dtype) for o, i in cycle]
        if packed:
            weights = [pack(w) for w in weights]
        sweeps = {}
        for rows in GEMM_ROWS:
            inputs = {i: torch.randn(rows, i, device=device).to(dtype) for i in {i for _, i in cycle}}
            # many rows are compute-bound: a few matrices measure them as well as all, and
            # keep a sweep to a fraction of a second on a CPU; always whole sets of the shapes,
            # so every row count is timed on the same mix (small matrices run slower)
            set_flops = sum(2.0 * rows * o * i for o, i in shapes)
            count = max(2, len(shapes) * max(1, int(_SWEEP_FLOPS // set_flops)))
            used = [(inputs[i], w) for w, (o, i) in zip(weights[:count], cycle)]
            flops = sum(2.0 * rows * o * i for o, i in cycle[:len(used)])
            sweeps[rows] = (lambda used=used: [linear(x, w) for x, w in used], flops)
        # row counts take turns over several passes, so on a shared machine each median spans
        # its slow and fast spells (one probe's second sees just one of them)
        times = {rows: [] for rows in GEMM_ROWS}
        for sweep, _ in sweeps.values():
            sweep()  # warm-up
        sync()
        for _ in range(_GEMM_PASSES):
            for rows, (sweep, _) in sweeps.items():
                times[rows] += _repetition_times(sweep, budget_s / len(GEMM_ROWS) / _GEMM_PASSES, sync, 1)
        rates = [sweeps[rows][1] / statistics.median(times[rows]) for rows in GEMM_ROWS]
        table[name] = {str(rows): rate for rows, rate in zip(GEMM_ROWS, nondecreasing(rates))}
    return table


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
    from flexlamps.models.config import ModelConfig
    from flexlamps.models.forward import forward_for
    from flexlamps.models.weight_specs import weight_specs

    def attend(q, k, v, opts=None):  # one token attending to itself: the cache's cost is not what is timed here
        return v.repeat_interleave(q.shape[2] // v.shape[2], dim=2).reshape(q.shape[0], q.shape[1], -1)

    def step_seconds(num_layers: int) -> float:
        cfg = ModelConfig(arch="llama", model_type="llama", vocab_size=64, hidden_size=32, num_layers=num_layers,
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

        return 1.0 / _typical_rate(decode_step, 1.0, budget_s / 2, _synchronizer(device))

    shallow, deep = 2, 10
    return max(0.0, (step_seconds(deep) - step_seconds(shallow)) / (deep - shallow))


def measure_cpu_attention(context: int, budget_s: float) -> float:
    """FLOP/s of one decode step of attention over a cache in CPU memory (fp32 compute)."""
    batch, heads, head_dim = 8, 16, 128
    q = torch.randn(batch, heads, 1, head_dim)
    k = torch.randn(batch, heads, context, head_dim)
    v = torch.randn(batch, heads, context, head_dim)
    attend = torch.nn.functional.scaled_dot_product_attention
    return _typical_rate(lambda: attend(q, k, v), 4.0 * batch * heads * head_dim * context, budget_s)


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

    sweep_s = 1.0 / _typical_rate(sweep, 1.0, budget_s, sync)
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
        seconds[numel] = 1.0 / _typical_rate(lambda: qt.dequantize(dtype=dtype), 1.0, budget_s / 2, sync)
    per_element = (seconds[large] - seconds[small]) / (large - small)
    return max(0.0, seconds[small] - small * per_element)


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


def _int4_rates(on_cpu, device: torch.device, shapes, sizes: ProbeSizes) -> tuple[dict, float]:
    """The fused 4-bit kernel's FLOP/s by rows (made nondecreasing in rows, as the GEMM tables
    are) and the 4-bit dequantization rate."""
    table, dequant = on_cpu(lambda: measure_int4(device, shapes, sizes.gemm_rows_bytes // 16,
                                                 2 * sizes.seconds_per_probe))
    return _nondecreasing_tables(table), dequant


def _int8_rates(shapes, sizes: ProbeSizes) -> dict:
    """The int8 GEMM's FLOP/s by rows for 4-bit prompts on this CPU (nondecreasing in rows), or {}."""
    return _nondecreasing_tables(_best_over_threads(
        lambda: measure_int8_prompts(shapes, sizes.gemm_rows_bytes // 4, 2 * sizes.seconds_per_probe)))


def _nondecreasing_tables(table: dict) -> dict:
    """{dtype: {rows: rate}} with each dtype's rates made nondecreasing in rows, as the GEMM tables are."""
    return {name: dict(zip(rows, nondecreasing(list(rows.values())))) for name, rows in table.items()}


def profile_machine(*, disk_folder: Path, quick: bool = False,
                    gpu_budget_bytes: int | None = None, model_shapes=None,
                    step: Callable[[str], None] = lambda name: None) -> HardwareSpec:
    """Run every probe and return the machine as a `HardwareSpec`.

    Args:
        disk_folder: where the disk probe writes its temporary file (the offload folder).
        quick: small probes, about ten seconds in all (for tests and smoke runs).
        gpu_budget_bytes: GPU memory to plan with; default: the device's memory on CUDA,
            a quarter of RAM on a CPU-only box.
        model_shapes: (out, in) of one layer's weight matrices (`ModelSpec.layer_matrix_shapes`)
            to time GEMMs and decompression on; default: a generic 2048x1024 matrix.
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
    gpu_bandwidth = on_cpu(lambda: measure_device_bandwidth(device, sizes.copy_bytes, budget_s))
    step("layer overhead")
    layer_overhead = on_cpu(lambda: measure_layer_overhead(device, budget_s), pick=min)
    step("gemm by rows")
    shapes = gemm_probe_shapes(model_shapes, quick)
    gemm_by_rows, gemm_by_rows_resident = _gemm_row_tables(on_cpu, device, sizes, shapes, has_cuda)
    # the decode roofline is what an 8-row fp32 GEMM streams (4 weight bytes per 2 FLOPs per
    # row); a memcpy only bounds it, and overstates it several times on a CPU
    gpu_bandwidth = min(gpu_bandwidth, gemm_by_rows["fp32"]["8"] * 4 / (2 * 8))
    step("gemm")
    gpu_gemm, cpu_gemm = _gemm_peaks(on_cpu, device, sizes, has_cuda)
    step("cpu attention")
    cpu_attention = _best_over_threads(lambda: measure_cpu_attention(sizes.attention_context, budget_s))
    step("dequantization")
    dequant_matrix_s, gpu_dequant, cpu_dequant = _dequant_rates(on_cpu, device, sizes, model_shapes, has_cuda)
    step("4-bit weights")
    int4_table, int4_dequant = _int4_rates(on_cpu, device, shapes, sizes)
    int8_table = {} if has_cuda else _int8_rates(shapes, sizes)
    gpu_mem, cpu_mem = _tier_memory(has_cuda, gpu_budget_bytes)
    return HardwareSpec(
        name=_profile_name(has_cuda, shapes),
        gpu_mem_bytes=int(gpu_mem), cpu_mem_bytes=int(cpu_mem),
        disk_bytes=int(shutil.disk_usage(disk_folder).free),
        cpu_to_gpu_bytes_per_s=to_gpu, gpu_to_cpu_bytes_per_s=to_cpu,
        disk_read_bytes_per_s=disk_read, disk_write_bytes_per_s=disk_write,
        gpu_matmul_flops_per_s=gpu_gemm, cpu_matmul_flops_per_s=cpu_gemm,
        gpu_mem_bytes_per_s=gpu_bandwidth, cpu_attention_flops_per_s=cpu_attention,
        gpu_dequant_bytes_per_s=gpu_dequant, cpu_dequant_bytes_per_s=cpu_dequant,
        gpu_layer_overhead_s=layer_overhead, gpu_dequant_matrix_s=dequant_matrix_s,
        gpu_gemm_flops_by_rows=gemm_by_rows, gpu_gemm_flops_by_rows_resident=gemm_by_rows_resident,
        gpu_is_host=not has_cuda, gpu_int4_gemm_flops_by_rows=int4_table, int4_dense_from_rows=INT4_DENSE_FROM_ROWS,
        gpu_int4_dequant_bytes_per_s=int4_dequant, gpu_int8_prompt_flops_by_rows=int8_table)


def _profile_name(has_cuda: bool, shapes) -> str:
    return (f"profile:{socket.gethostname()}" + ("" if has_cuda else " (cpu as gpu)")
            + (f", matrices {'/'.join(f'{o}x{i}' for o, i in shapes)}" if shapes != GENERIC_SHAPES else ""))


def _disk_rates(disk_folder: Path, sizes, model_shapes, has_cuda: bool) -> tuple[float, float]:
    """Read and write rates over the engine's tensor files: the model's matrices in its dtype
    (fp16 on GPUs, fp32 here)."""
    itemsize = 2 if has_cuda else 4
    file_shapes = probe_shapes(model_shapes, itemsize, sizes.disk_file_bytes)
    return measure_disk(disk_folder, sizes.disk_file_bytes, [o * i * itemsize for o, i in file_shapes])


def _gemm_row_tables(on_cpu, device: torch.device, sizes, shapes, has_cuda: bool) -> tuple[dict, dict]:
    """GEMM rates by row count: streamed weights, and (on CPUs, where resident weights are
    prepacked) resident ones; on GPUs packing is a no-op and the second table would repeat."""
    # fp16 GEMMs are emulated (and slow) on CPUs; engines there run fp32 or bf16
    row_dtypes = ("fp32", "bf16", "fp16") if has_cuda else ("fp32", "bf16")
    rows_budget_s = 2 * sizes.seconds_per_probe  # the planner's main input: twice a probe's time
    rows_bytes = sizes.gemm_rows_bytes
    streamed = on_cpu(lambda: measure_gemm_by_rows(device, rows_bytes, rows_budget_s, row_dtypes, shapes))
    resident = {} if has_cuda else on_cpu(
        lambda: measure_gemm_by_rows(device, rows_bytes, rows_budget_s, row_dtypes, shapes, packed=True))
    return streamed, resident


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
               "dequantization", "4-bit weights")


# 2: engine's linear, weight-streaming roofline, per-layer overhead, GEMM rate by rows;
# 3: dequantization over a sweep of matrices + a per-matrix cost, the engine's allocator;
# 4: GEMM rates for resident (prepacked) weights; 5: median repetitions, a model's own
# matrices, tensor-sized disk files, gpu_is_host; 6: the engine's 4-bit weights (fused kernel
# by rows, dequantization rate, the switch between them); 7: those in passes taking turns;
# 8: a quick GEMM check beside each profile, so one measured on a busy box is measured again;
# 9: the int8 GEMM 4-bit prompts run on (a CPU with it)
PROFILE_VERSION = 9


def profile_cache_path(shapes=None) -> Path:
    """Where the profile timed on matrices of `shapes` (None: the generic ones) is cached."""
    root = cache_root()
    # versioned: a profile written before the probes changed is measured again, not reused
    name = f"hardware-v{PROFILE_VERSION}"
    if shapes:
        import hashlib

        name += "-" + hashlib.sha256(repr(tuple(map(tuple, shapes))).encode()).hexdigest()[:12]
    return Path(root) / f"{name}.json"


# A cached profile is measured again when a quick GEMM now runs this much faster than it did
# right after the profile was taken: that profile was measured on a busy machine (one cached
# at 57 GFLOP/s bf16 where a quiet box gives about 200 kept plans slow for good). A slower
# check keeps the cache: the box is busy now, and the quiet-box profile is the better guess.
STALE_PROFILE_SPEEDUP = 1.5
_CHECK_DIM = 256
_CHECK_BUDGET_S = 0.03


def check_rate() -> float:
    """FLOP/s of a small fp32 GEMM through the engine's `linear` (median of ~30 ms of calls): a
    cheap reading of how much of the CPU this process gets right now."""
    a = torch.randn(_CHECK_DIM, _CHECK_DIM)
    b = torch.randn(_CHECK_DIM, _CHECK_DIM)
    return _typical_rate(lambda: linear(a, b), 2.0 * _CHECK_DIM**3, _CHECK_BUDGET_S)


def _check_path(profile_path: Path) -> Path:
    return profile_path.with_name(profile_path.stem + ".check.json")


def _cached_profile(path: Path) -> tuple[HardwareSpec | None, str]:
    """(the cached profile at `path`, "") if it can be used, else (None, why it is measured)."""
    if not path.exists():
        return None, "first run"
    try:
        spec = HardwareSpec.from_json(path.read_text())
    except (ValueError, TypeError, KeyError):
        return None, "the cached profile is damaged"
    try:
        recorded = float(json.loads(_check_path(path).read_text())["gemm_flops"])
    except (OSError, ValueError, TypeError, KeyError):
        return spec, ""  # no check beside it (written by hand, or by an older flexlamps): trusted
    now = check_rate()
    if now > STALE_PROFILE_SPEEDUP * recorded:
        return None, (f"it was measured on a busy machine (a quick GEMM ran {now / recorded:.1f}x "
                      f"slower then than now)")
    return spec, ""


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def machine_profile(scratch: Path, on_measure=None, model_shapes=None) -> HardwareSpec:
    """This machine's profile: the cached one, or a quick measurement made now and cached for
    the next run. `model_shapes`: the model's layer matrices, to time GEMMs and decompression
    on (a model too big for the quick probes gets the generic profile). `on_measure(path,
    why)` is told before a measurement."""
    shapes = gemm_probe_shapes(model_shapes, quick=True)
    path = profile_cache_path(None if shapes == GENERIC_SHAPES else shapes)
    spec, why = _cached_profile(path)
    if spec is not None:
        return spec
    if on_measure:
        on_measure(path, why)
    scratch.mkdir(parents=True, exist_ok=True)
    spec = profile_machine(disk_folder=scratch, quick=True, model_shapes=model_shapes)
    _write_atomic(path, spec.to_json())
    _write_atomic(_check_path(path), json.dumps({"gemm_flops": check_rate()}))
    return spec
