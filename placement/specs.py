"""Hardware, workload and policy specs: frozen, keyword-only dataclasses with units in names.

`ModelSpec` lives in `placement.model_spec`. Nothing here imports torch.
"""

import dataclasses
import math
from dataclasses import dataclass, field

from placement.jsonable import JsonMixin
from quant.config import engine_weight_bytes_per_element
from placement.latent_pools import LatentMissCurves

DTYPES = ("fp32", "bf16", "fp16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
PHASES = ("prompt", "decode")  # the engine's two kinds of step (a MoE expert's rate differs by phase)
_SUM_TOLERANCE = 1e-6
# A compressed cache quantizes keys per channel over blocks of this many tokens (values per
# token along the head dim): what keeps 4-bit caches within ~2% of full precision on SmolLM2.
CACHE_KEY_GROUP_TOKENS = 32


def _require_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec(JsonMixin):
    """One machine: capacity and speed of its GPU, CPU memory and disk tiers.

    On a CPU-only box the "gpu" tier is the CPU device itself with a user-chosen budget.
    """

    name: str = "custom"
    gpu_mem_bytes: int  # usable GPU memory
    cpu_mem_bytes: int  # usable CPU (host) memory
    disk_bytes: int  # usable space in the offload folder
    cpu_to_gpu_bytes_per_s: float  # pinned host -> device copy
    gpu_to_cpu_bytes_per_s: float  # device -> pinned host copy
    disk_read_bytes_per_s: float  # page cache dropped
    disk_write_bytes_per_s: float  # page cache dropped, fsync'ed
    gpu_matmul_flops_per_s: dict[str, float]  # dense GEMM throughput, by dtype (fp32/bf16/fp16)
    cpu_matmul_flops_per_s: dict[str, float]  # dense GEMM on the CPU, by dtype
    gpu_mem_bytes_per_s: float  # GPU memory bandwidth (decode roofline)
    cpu_attention_flops_per_s: float  # decode attention on the CPU over an fp16 cache
    gpu_dequant_bytes_per_s: float  # 4-bit -> fp16 on the GPU, counted in fp16 output bytes
    cpu_dequant_bytes_per_s: float  # 4-bit -> fp16 on the CPU, counted in fp16 output bytes
    # fixed cost of running one layer on one micro-batch (kernel launches, host dispatch):
    # negligible for big layers, most of a decode step for small models or small batches
    gpu_layer_overhead_s: float = 0.0
    # fixed cost of decompressing one 4-bit weight matrix on the GPU (its group parameters,
    # dispatch): a third of a small model's decompression time on a CPU, noise on big matrices
    gpu_dequant_matrix_s: float = 0.0
    # the "gpu" is the host CPU itself (a CPU-only box): copies between the gpu and cpu tiers,
    # and a disk read's copy out of the page cache, are memcpys on the cores that compute, so
    # they add to compute time instead of overlapping it as a GPU's DMA engines do
    gpu_is_host: bool = False
    # measured GEMM FLOP/s by dtype and by the number of rows (tokens) in the call, e.g.
    # {"fp32": {"1": 4e9, "32": 6e10, "2048": 1e11}}; small calls reach far less than the peak
    # and less than the bandwidth roofline on CPUs. Empty: use peak FLOP/s and the roofline.
    gpu_gemm_flops_by_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same for weights resident on the GPU tier for the whole run, where the engine keeps
    # them in the GEMM's own layout (prepacked for oneDNN on CPUs). Empty: as streamed weights.
    gpu_gemm_flops_by_rows_resident: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same for decode calls where the engine multiplies them with another kernel than prompts
    # (16-bit decode rows on a CPU without oneDNN's 16-bit GEMM: a native kernel); the tables above
    # are measured on prompt calls. Empty: the tables above for both phases.
    gpu_gemm_flops_by_rows_decode: dict[str, dict[str, float]] = field(default_factory=dict)
    # a sparse-attention MLA model's latent-pool misses per layer, measured on it by `flexlamps
    # profile --model` (None: the planner uses ESS's curves)
    latent_miss_curves: LatentMissCurves | None = None
    # 4-bit weights as the engine runs them: calls of fewer than `int4_dense_from_rows` rows
    # multiply the packed codes in place (a fused kernel, FLOP/s by dtype and rows below), calls
    # of more dequantize each matrix once a layer and sweep and run the dense GEMM. Empty table:
    # every compressed call is priced as dequantization + dense GEMM.
    gpu_int4_gemm_flops_by_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    int4_dense_from_rows: int = 0  # the engine's switch (rows per call); 0: no fused kernel
    # decompression of those 4-bit weights, in fp16 output bytes/s (0: gpu_dequant_bytes_per_s)
    gpu_int4_dequant_bytes_per_s: float = 0.0
    # where the engine runs the calls of `int4_dense_from_rows` rows or more of 4-bit weights on
    # int8 codes instead of the dense GEMM (a CPU with flexlamps' int8 GEMM): its FLOP/s by dtype
    # and rows. Empty: those calls are priced on the dense GEMM.
    gpu_int8_prompt_flops_by_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    # the host's memory bandwidth (MoE experts computed where they live stream it); 0: unmeasured,
    # the gpu's where the gpu is the host, else the CPU attention rate (which streams its cache)
    cpu_mem_bytes_per_s: float = 0.0
    # a hybrid model's gated delta rule as the engine runs it (small batched matmuls, triangular
    # solves, decays: far below the GEMM rate), FLOP/s as `delta_rule_flops` counts them, for
    # "decode" (one token a row, its open chunk padded to a chunk) and "prompt" (whole chunks).
    # Empty: a third of the fp32 GEMM rate at a chunk's rows (measured so on a Zen 2 CPU).
    gpu_delta_rule_flops_per_s: dict[str, float] = field(default_factory=dict)
    # a MoE model's routed experts as the engine multiplies them, by phase ("prompt", "decode"),
    # dtype and the tokens one expert gets: {"prompt": {"bf16": {"16": 3e10, ...}}, "decode": ...}.
    # On a CPU without a fast 16-bit GEMM prompt tokens on 16-bit experts multiply in fp32, decode
    # tokens in the dtype: rates the dense table does not give. Measured through the engine's own
    # expert product (`flexlamps profile --model` a MoE model). Empty: the dense table's rates.
    gpu_expert_flops_by_rows: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # the same for the engine's 4-bit experts, by the activations' dtype. Empty: as other 4-bit calls.
    gpu_int4_expert_flops_by_rows: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # attention as the engine runs a layer's (its cache's write and read, the mask, the exact per-query
    # product), by phase ("prompt", "decode") and dtype, FLOP/s as `ModelSpec.attention_flops_per_query`
    # counts them: on a CPU 5-20 GFLOP/s, far below the GEMM peak the planner otherwise prices it at.
    # Empty (a preset): the GEMM peak, and a decode's cache read at memory bandwidth.
    gpu_attention_flops_per_s: dict[str, dict[str, float]] = field(default_factory=dict)
    # ... and the seconds a layer's attention call costs beyond its FLOPs (its fixed cost), by phase and dtype
    gpu_attention_call_s: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self):
        _require_positive(
            "HardwareSpec",
            gpu_mem_bytes=self.gpu_mem_bytes, cpu_mem_bytes=self.cpu_mem_bytes,
            disk_bytes=self.disk_bytes, cpu_to_gpu_bytes_per_s=self.cpu_to_gpu_bytes_per_s,
            gpu_to_cpu_bytes_per_s=self.gpu_to_cpu_bytes_per_s,
            disk_read_bytes_per_s=self.disk_read_bytes_per_s,
            disk_write_bytes_per_s=self.disk_write_bytes_per_s,
            gpu_mem_bytes_per_s=self.gpu_mem_bytes_per_s,
            cpu_attention_flops_per_s=self.cpu_attention_flops_per_s,
            gpu_dequant_bytes_per_s=self.gpu_dequant_bytes_per_s,
            cpu_dequant_bytes_per_s=self.cpu_dequant_bytes_per_s)
        if not isinstance(self.gpu_is_host, bool):
            raise ValueError(f"HardwareSpec.gpu_is_host must be true or false, got {self.gpu_is_host!r}")
        for name in ("gpu_layer_overhead_s", "gpu_dequant_matrix_s", "gpu_int4_dequant_bytes_per_s",
                     "cpu_mem_bytes_per_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"HardwareSpec.{name} must be >= 0, got {getattr(self, name)!r}")
        if not (isinstance(self.int4_dense_from_rows, int) and self.int4_dense_from_rows >= 0):
            raise ValueError(f"HardwareSpec.int4_dense_from_rows must be an integer >= 0, got "
                             f"{self.int4_dense_from_rows!r}")
        for attr in ("gpu_gemm_flops_by_rows", "gpu_gemm_flops_by_rows_resident", "gpu_gemm_flops_by_rows_decode",
                     "gpu_int4_gemm_flops_by_rows", "gpu_int8_prompt_flops_by_rows"):
            _check_rows_tables(f"HardwareSpec.{attr}", getattr(self, attr))
        for attr in ("gpu_expert_flops_by_rows", "gpu_int4_expert_flops_by_rows"):
            for phase, tables in getattr(self, attr).items():
                if phase not in PHASES or not isinstance(tables, dict):
                    raise ValueError(f"HardwareSpec.{attr}: expected {{phase in {PHASES}: {{dtype: "
                                     f"{{rows: FLOP/s}}}}}}, got {phase!r}: {tables!r}")
                _check_rows_tables(f"HardwareSpec.{attr}[{phase!r}]", tables)
        for attr, check in (("gpu_attention_flops_per_s", _require_positive), ("gpu_attention_call_s", _require_sane)):
            for phase, values in getattr(self, attr).items():
                if phase not in PHASES or not isinstance(values, dict) or not set(values) <= set(DTYPES):
                    raise ValueError(f"HardwareSpec.{attr}: expected {{phase in {PHASES}: {{dtype in {DTYPES}: "
                                     f"value}}}}, got {phase!r}: {values!r}")
                check(f"HardwareSpec.{attr}[{phase!r}]", **values)
        for phase, flops in self.gpu_delta_rule_flops_per_s.items():
            if phase not in ("decode", "prompt"):
                raise ValueError(f"HardwareSpec.gpu_delta_rule_flops_per_s: unknown phase {phase!r}; "
                                 "use 'decode' and 'prompt'")
            _require_positive("HardwareSpec.gpu_delta_rule_flops_per_s", **{phase: flops})
        for attr in ("gpu_matmul_flops_per_s", "cpu_matmul_flops_per_s"):
            table = getattr(self, attr)
            if not isinstance(table, dict) or not table:
                raise ValueError(f"HardwareSpec.{attr} must map dtypes {DTYPES} to FLOP/s")
            for dtype, flops in table.items():
                if dtype not in DTYPES:
                    raise ValueError(f"HardwareSpec.{attr}: unknown dtype {dtype!r}; use {DTYPES}")
                _require_positive(f"HardwareSpec.{attr}", **{dtype: flops})

    def gpu_flops(self, dtype: str) -> float:
        """GEMM FLOP/s for `dtype`, falling back to the fastest 16-bit entry, then fp32."""
        table = self.gpu_matmul_flops_per_s
        for key in (dtype, "fp16", "bf16", "fp32"):
            if key in table:
                return table[key]
        raise KeyError(dtype)

    def gemm_seconds(self, dtype: str, rows: float, flops: float, weight_bytes: float, *,
                     resident: bool = False, decode: bool = False) -> float:
        """Time of GEMMs doing `flops` on `rows` tokens per call over `weight_bytes` of weights
        (`resident`: weights that stay on the GPU tier, see gpu_gemm_flops_by_rows_resident;
        `decode`: decode calls, gpu_gemm_flops_by_rows_decode where it has the dtype).

        From the measured table when there is one (interpolated in log rows, clamped at its
        ends), else the roofline: the larger of compute at peak and streaming the weights.
        """
        table = ((decode and self.gpu_gemm_flops_by_rows_decode.get(dtype))
                 or (resident and self.gpu_gemm_flops_by_rows_resident.get(dtype))
                 or self.gpu_gemm_flops_by_rows.get(dtype))
        if not table:
            return max(flops / self.gpu_flops(dtype), weight_bytes / self.gpu_mem_bytes_per_s)
        return flops / _rate_at(table, rows)

    def int4_prompt_seconds(self, dtype: str, rows: float, flops: float) -> float | None:
        """Time of 4-bit weights' calls of `rows` rows doing `flops` on int8 codes, or None where
        the engine runs the dense GEMM for them (fewer rows than int4_dense_from_rows, or no table)."""
        table = self.gpu_int8_prompt_flops_by_rows.get(dtype)
        if not table or rows < self.int4_dense_from_rows:
            return None
        return flops / _rate_at(table, rows)

    def int4_gemm_seconds(self, dtype: str, rows: float, flops: float) -> float | None:
        """Time of the fused 4-bit kernel doing `flops` on calls of `rows` rows, or None where the
        engine takes the dense path instead (`rows` >= int4_dense_from_rows, or no table)."""
        table = self.gpu_int4_gemm_flops_by_rows.get(dtype)
        if not table or rows >= self.int4_dense_from_rows:
            return None
        return flops / _rate_at(table, rows)

    def expert_seconds(self, phase: str, dtype: str, rows: float, flops: float, *, int4: bool = False) -> float | None:
        """Time of routed experts' products doing `flops` in `phase` with `rows` tokens an expert
        (`int4`: the engine's 4-bit experts), as measured through the engine's expert product, or
        None where the profile has no such table."""
        tables = self.gpu_int4_expert_flops_by_rows if int4 else self.gpu_expert_flops_by_rows
        table = tables.get(phase, {}).get(dtype)
        return flops / _rate_at(table, rows) if table else None

    def attention_seconds(self, phase: str, dtype: str, flops: float, calls: float = 1) -> float:
        """Time of a layer's `calls` attention calls doing `flops` in `phase` on the gpu tier: each call's
        fixed cost and the FLOPs at the measured rate (`gpu_attention_call_s`, `gpu_attention_flops_per_s`),
        else the FLOPs at the GEMM peak."""
        rate = self.gpu_attention_flops_per_s.get(phase, {}).get(dtype)
        call_s = self.gpu_attention_call_s.get(phase, {}).get(dtype, 0.0)
        return calls * call_s + flops / (rate or self.gpu_flops(dtype))

    def delta_rule_seconds(self, phase: str, flops: float, chunk: int) -> float:
        """Time of `flops` of the gated delta rule in `phase` ("decode" or "prompt")."""
        rate = self.gpu_delta_rule_flops_per_s.get(phase)
        if rate is None:
            table = self.gpu_gemm_flops_by_rows.get("fp32")
            rate = (_rate_at(table, chunk) if table else self.gpu_flops("fp32")) / 3
        return flops / rate

    @property
    def cpu_memory_bytes_per_s(self) -> float:
        """The host's memory bandwidth: measured, or its stand-in (`cpu_mem_bytes_per_s`)."""
        if self.cpu_mem_bytes_per_s:
            return self.cpu_mem_bytes_per_s
        return self.gpu_mem_bytes_per_s if self.gpu_is_host else self.cpu_attention_flops_per_s

    @property
    def int4_dequant_bytes_per_s(self) -> float:
        return self.gpu_int4_dequant_bytes_per_s or self.gpu_dequant_bytes_per_s

    def with_memory(self, *, gpu_mem_bytes: int | None = None,
                    cpu_mem_bytes: int | None = None, disk_bytes: int | None = None):
        """A copy with some capacities overridden (None keeps the current value)."""
        changes = {k: v for k, v in (("gpu_mem_bytes", gpu_mem_bytes),
                                     ("cpu_mem_bytes", cpu_mem_bytes),
                                     ("disk_bytes", disk_bytes)) if v is not None}
        return dataclasses.replace(self, **changes)


def _require_sane(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{owner}.{name} must be a number >= 0, got {value!r}")


def _check_rows_tables(owner: str, tables: dict) -> None:
    """Refuse {dtype: {rows: FLOP/s}} tables with an unknown dtype, a bad row count or rate."""
    for dtype, table in tables.items():
        if dtype not in DTYPES or not isinstance(table, dict) or not table:
            raise ValueError(f"{owner}: expected {{dtype in {DTYPES}: {{rows: FLOP/s}}}}, got {dtype!r}: {table!r}")
        for rows, flops in table.items():
            if not str(rows).isdigit() or int(rows) < 1:
                raise ValueError(f"{owner}[{dtype!r}]: rows must be an integer >= 1, got {rows!r}")
            _require_positive(f"{owner}[{dtype!r}]", **{str(rows): flops})


def _rate_at(table: dict[str, float], rows: float) -> float:
    """A measured {rows: FLOP/s} table at `rows`: interpolated in log rows, clamped at its ends."""
    points = sorted((int(r), f) for r, f in table.items())
    x = math.log(max(rows, 1.0))
    xs = [math.log(r) for r, _ in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    i = next(i for i in range(1, len(xs)) if x <= xs[i])
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return math.exp((1 - t) * math.log(points[i - 1][1]) + t * math.log(points[i][1]))


# a prompt step is at least this many columns wide (a one-token prompt gets a padded column): a
# prompt is always multiplied as a prompt, never as a decode step (the engine's batch invariance)
MIN_PROMPT_COLUMNS = 2


def prompt_columns(tokens: int) -> int:
    """Columns of a prompt step that feeds `tokens` tokens of each row, as the engine pads it."""
    return max(MIN_PROMPT_COLUMNS, tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec(JsonMixin):
    """A batch job: every sequence has the same prompt and output length (FlexGen's setting)."""

    prompt_len: int  # tokens per prompt, including the shared prefix
    gen_len: int  # tokens generated per sequence
    shared_prefix_len: int = 0  # leading prompt tokens common to all sequences (computed once)

    @property
    def prompt_columns(self) -> int:
        """Columns of the widest prompt step (`prompt_columns`): what its calls hold at once."""
        return prompt_columns(self.prompt_len)

    def __post_init__(self):
        for name in ("prompt_len", "gen_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"WorkloadSpec.{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.shared_prefix_len, int)
                and 0 <= self.shared_prefix_len <= self.prompt_len):
            raise ValueError(f"WorkloadSpec.shared_prefix_len must be in [0, prompt_len="
                             f"{self.prompt_len}], got {self.shared_prefix_len!r}")


_SOLVER_NOISE = 1e-9  # HiGHS's feasibility tolerance: a fraction below it is the LP's round-off


@dataclass(frozen=True, slots=True, kw_only=True)
class TierSplit(JsonMixin):
    """Fractions of one kind of data on each tier; each in [0, 1], summing to 1."""

    gpu: float
    cpu: float
    disk: float

    def __post_init__(self):
        parts = (self.gpu, self.cpu, self.disk)
        if any(not math.isfinite(p) or p < -_SUM_TOLERANCE or p > 1 + _SUM_TOLERANCE
               for p in parts):
            raise ValueError(f"TierSplit fractions must lie in [0, 1], got {parts}")
        if abs(sum(parts) - 1.0) > _SUM_TOLERANCE:
            raise ValueError(f"TierSplit fractions must sum to 1, got {parts} (sum {sum(parts)})")

    @classmethod
    def clipped(cls, gpu: float, cpu: float, disk: float) -> "TierSplit":
        """Build from solver output: clip tiny negatives, drop fractions within the solver's
        tolerance (1e-9 of the cache on disk is round-off, yet an engine without a disk cache
        would refuse it) and renormalize the round-off."""
        parts = [min(max(float(p), 0.0), 1.0) + 0.0 for p in (gpu, cpu, disk)]  # + 0.0: no -0.0
        parts = [p if p > _SOLVER_NOISE else 0.0 for p in parts]
        parts = [round(p / sum(parts), 12) for p in parts]
        largest = parts.index(max(parts))
        parts[largest] = 1.0 - sum(p for i, p in enumerate(parts) if i != largest)
        return cls(gpu=parts[0], cpu=parts[1], disk=parts[2])

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.gpu, self.cpu, self.disk)


ALL_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCapabilities(JsonMixin):
    """The placements an engine runs exactly as planned; `solve` searches only those.

    The defaults are what flexlamps' offload engine runs (it declares the same value itself,
    and a test keeps the two equal); `unrestricted()` is the whole space of FlexGen's cost
    model, for planning an engine that can do everything.
    """

    cache_on_disk: bool = True  # KV cache layers may live on the disk tier (not MLA's or DeltaNet's)
    activations_on_disk: bool = False  # the hidden states between layers may live on disk
    # the hidden states may be spread over several tiers at once; False: all on one tier
    split_activations: bool = False
    merged_decode: bool = True  # decode micro-batches may run as one merged batch per layer
    per_micro_batch_decode: bool = True  # ... or one by one (FlexGen's order)
    cpu_attention: bool = True  # decode attention over off-GPU cache may run on the CPU
    weight_compression: bool = True  # weights may be stored group-wise quantized
    cache_compression: bool = True  # the KV cache may be stored group-wise quantized
    # 4-bit weights in fp16/bf16 multiply in place (a fused kernel, no dense copy) on calls of
    # fewer rows than this; larger calls dequantize them (0: always dequantized)
    int4_in_place_below_rows: int = 128

    def __post_init__(self):
        if not (self.merged_decode or self.per_micro_batch_decode):
            raise ValueError("EngineCapabilities: an engine must run decode merged, per "
                             "micro-batch, or both")

    @classmethod
    def unrestricted(cls) -> "EngineCapabilities":
        return cls(cache_on_disk=True, activations_on_disk=True, split_activations=True)

    def activation_tiers(self) -> tuple[str, ...]:
        """Tiers the hidden states may live on."""
        return ("gpu", "cpu", "disk") if self.activations_on_disk else ("gpu", "cpu")

    def unsupported(self, policy: "Policy") -> list[str]:
        """What in `policy` this engine would not run as planned (empty: all of it runs)."""
        problems = []
        if policy.cache.disk > 0 and not self.cache_on_disk:
            problems.append(f"{policy.cache.disk:.0%} of the KV cache on disk")
        if policy.activations.disk > 0 and not self.activations_on_disk:
            problems.append(f"{policy.activations.disk:.0%} of the activations on disk")
        if max(policy.activations.as_tuple()) < 1 and not self.split_activations:
            problems.append("activations split across tiers")
        if policy.num_gpu_batches > 1 and not (
                self.merged_decode if policy.merge_decode else self.per_micro_batch_decode):
            problems.append("merged decode" if policy.merge_decode else "decode one micro-batch at a time")
        for flag, able, what in ((policy.cpu_attention, self.cpu_attention, "CPU attention"),
                                 (policy.compress_weight, self.weight_compression, "weight compression"),
                                 (policy.compress_cache, self.cache_compression, "cache compression")):
            if flag and not able:
                problems.append(what)
        return problems


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressionSpec(JsonMixin):
    """Group-wise asymmetric min-max quantization (FlexGen's): a min and a scale per group."""

    num_bits: int = 4
    group_size: int = 64

    def __post_init__(self):
        if self.num_bits not in (4, 8) or self.group_size < 1:
            raise ValueError(f"CompressionSpec: num_bits must be 4 or 8 and group_size >= 1, "
                             f"got {self.num_bits}, {self.group_size}")

    def bytes_per_element(self, dtype_bytes: int = 2) -> float:
        """Stored bytes per element: packed codes plus a min and a scale per group, both in
        the uncompressed dtype (as `quant.config.QuantConfig.packed_nbytes` counts them)."""
        return self.num_bits / 8 + 2 * dtype_bytes / self.group_size

    def weight_bytes_per_element(self, dtype_bytes: int = 2) -> float:
        """Stored bytes per weight element: the engine keeps weights in its own layout
        (`quant.config.engine_weight_config`: groups of 32 input channels), whatever
        `group_size` says for the cache."""
        return engine_weight_bytes_per_element(self.num_bits, "float32" if dtype_bytes == 4 else "bfloat16")

    def cache_bytes_per_element(self, capacity: int, dtype_bytes: int = 2) -> float:
        """Stored bytes per cache element, keys and values averaged, as the engine lays a
        compressed cache out: values per token in groups along the head dim
        (`bytes_per_element`); keys per channel over blocks of CACHE_KEY_GROUP_TOKENS tokens
        (codes plus a min and a scale per channel and block, blocks rounded up to hold
        `capacity` tokens), plus one block of recent keys uncompressed per sequence."""
        group = CACHE_KEY_GROUP_TOKENS
        block_tokens = -(-capacity // group) * group
        keys = block_tokens / capacity * (self.num_bits / 8 + 2 * dtype_bytes / group)
        keys += group * dtype_bytes / capacity
        return (keys + self.bytes_per_element(dtype_bytes)) / 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy(JsonMixin):
    """Where the engine keeps weights, KV cache and activations, and how it batches.

    A block of `num_gpu_batches * gpu_batch_size` sequences runs layer by layer (zig-zag).
    """

    gpu_batch_size: int  # sequences per GPU micro-batch
    num_gpu_batches: int  # micro-batches per block
    weights: TierSplit  # fraction of every layer's weight bytes on each tier
    cache: TierSplit  # fraction of the KV (or MLA latent) cache on each tier
    activations: TierSplit  # fraction of the hidden states between layers on each tier
    compress_weight: bool = False  # weights stored group-wise quantized on every tier
    compress_cache: bool = False  # KV cache stored group-wise quantized on every tier
    cpu_attention: bool = False  # decode attention over the CPU/disk part of the cache runs on CPU
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    # decode micro-batches run each layer as one merged batch (one GEMM per matrix over the whole
    # block; its workspace and staged cache reserved for the block). False: one by one, as
    # FlexGen's engine does, reserving one micro-batch's workspace.
    merge_decode: bool = True
    # a sparse-attention MLA model's latent cache off the gpu tier (ESS's layout): per layer, its
    # gpu pool as a fraction of the context (their mean is cache.gpu). Empty: cache.gpu for every layer.
    latent_pools: tuple[float, ...] = ()
    # a MoE layer's cpu-tier experts are computed on the CPU where they live (no copy) when its
    # routed tokens per expert are fewer than this, else copied to the compute device for a
    # batched GEMM (0: always copied); the planner sets it from the machine's rates
    cpu_expert_tokens: int = 0
    # a MoE layer's routed experts staged on the gpu tier at once, at most: its touched experts
    # stream through in groups of this many, one given back as the next is read (0: every expert
    # a sweep's tokens pick, staged together for the layer)
    expert_group: int = 0

    def __post_init__(self):
        for name in ("gpu_batch_size", "num_gpu_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Policy.{name} must be an integer >= 1, got {value!r}")
        for name in ("cpu_expert_tokens", "expert_group"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 0):
                raise ValueError(f"Policy.{name} must be an integer >= 0, got {value!r}")
        object.__setattr__(self, "latent_pools", tuple(float(f) for f in self.latent_pools))
        if not all(0 < f <= 1 for f in self.latent_pools):
            raise ValueError(f"Policy.latent_pools must be fractions in (0, 1], got {self.latent_pools}")

    @property
    def block_size(self) -> int:
        """Sequences processed together per block (FlexGen's effective batch size)."""
        return self.gpu_batch_size * self.num_gpu_batches
