"""The whole process's planned memory, checked against `--max-rss` before the model loads.

Tier budgets bound what the offload engine holds; the process also holds a fixed overhead
that no budget sees: the Python interpreter and torch (about 230 MiB on CPU), the checkpoint
reader and tokenizer, and the engine's working buffers; and, while the weights are written, what
building them holds beyond what it keeps (`placement.cost_memory.build_transient_bytes`, from the
model's shapes).
"""

from __future__ import annotations

import dataclasses

import click

from flexlamps.catalog import describe_model
from placement.cost_memory import build_transient_bytes

# measured with the built-in SmolLM2-135M on CPU (README "Memory"): peak RSS minus tier peaks
FIXED_OVERHEAD_BYTES = 450 * 2**20


def planned_rss_bytes(model, weight_bytes_per_param: float | None, *, offload_budgets: tuple[int, int] | None,
                      num_sequences: int, context_len: int, cache_bytes_per_value: int = 4,
                      weight_bytes: int | None = None) -> int:
    """Fixed overhead and the build's transients (`build_transient_bytes`) plus what the run's data
    may take: with offloading the two tier budgets (caps the engine enforces), else every weight of
    `model` (the run's `placement.ModelSpec`) at `weight_bytes_per_param`, or `weight_bytes` in all,
    and a full cache for `num_sequences`, its keys and values `cache_bytes_per_value` bytes each (the
    dtype the dense cache holds)."""
    overhead = FIXED_OVERHEAD_BYTES + build_transient_bytes(model, offload_budgets is not None)
    if offload_budgets is not None:
        return overhead + sum(offload_budgets)
    spec = dataclasses.replace(model, dtype="fp32")
    weights = spec.total_weight_bytes() / 4 * weight_bytes_per_param if weight_bytes is None else weight_bytes
    cache = spec.cache_bytes_per_token_per_layer() / 4 * cache_bytes_per_value
    state = spec.state_bytes_per_sequence_per_layer()  # a hybrid model's DeltaNet states (fp32 bound)
    return int(overhead + weights + (cache * context_len + state) * spec.num_layers * num_sequences)


def cpu_mem_within(max_rss: int, gpu_mem: int, gpu_is_host: bool, model=None) -> int:
    """The cpu tier a memory cap leaves the offload engine: the cap less the fixed overhead, the
    build's transients of `model` (a `placement.ModelSpec`, offloaded: `build_transient_bytes`) and,
    where the gpu tier is host memory (no GPU), the gpu tier (`--max-rss` with `--gpu-mem` and no
    `--cpu-mem`: the whole cap goes to the engine, as a peer's page cache would take it)."""
    transient = 0 if model is None else build_transient_bytes(model, offloaded=True)
    return max_rss - FIXED_OVERHEAD_BYTES - transient - (gpu_mem if gpu_is_host else 0)


def overheads_text(model, fmt, offloaded: bool = True) -> str:
    """What a cap pays beside the tiers, said with `fmt` (bytes -> text): the fixed overhead and the
    build's transients of `model` (a `placement.ModelSpec`, `build_transient_bytes`)."""
    transient = build_transient_bytes(model, offloaded)
    return f"the fixed overhead ({fmt(FIXED_OVERHEAD_BYTES)}), the build's transients ({fmt(transient)})"


def fill_cap(run, max_rss: int, gpu_is_host: bool, model=None):
    """`run` with its cpu tier what `max_rss` leaves (`cpu_mem_within`) after the build's transients
    (`build_transient_bytes` of `model`, the run's `placement.ModelSpec`; default: `run.model`
    described as `flexlamps plan` describes it), and the line that says so; unchanged (and None)
    unless offloaded with a gpu tier given and the cpu tier not."""
    if not run.offloaded or run.gpu_mem is None or run.cpu_mem is not None:
        return run, None
    mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
    model = _described(run.model) if model is None else model
    cpu_mem = cpu_mem_within(max_rss, run.gpu_mem, gpu_is_host, model)
    overheads = overheads_text(model, mib)
    if cpu_mem <= 0:
        raise click.ClickException(
            f"--max-rss {mib(max_rss)} leaves no cpu tier after {overheads}"
            + (f" and --gpu-mem {mib(run.gpu_mem)} (host memory here)" if gpu_is_host else "")
            + "; raise --max-rss or lower --gpu-mem")
    line = (f"cpu tier {mib(cpu_mem)}: what --max-rss {mib(max_rss)} leaves after {overheads}"
            + (" and the gpu tier (host memory here)" if gpu_is_host else ""))
    return dataclasses.replace(run, cpu_mem=cpu_mem), line


def _described(model: str):
    """The planner's description of `--model` (`catalog.describe_model`), a usage error if none."""
    try:
        return describe_model(model)
    except ValueError as e:
        raise click.ClickException(str(e))


def _offload_budgets(run) -> tuple[int, int] | None:
    if not run.offloaded:
        return None
    run = run.with_budgets()
    return run.gpu_mem, run.cpu_mem  # the defaults are LLM's: one definition, in RunSettings


def check_max_rss(settings, max_rss: int, num_prompts: int, reader, model) -> None:
    """Refuse (before loading the weights) a run whose planned memory exceeds `max_rss`; `reader`
    and `model`: the run's checkpoint reader and its `placement.ModelSpec` (an unprepared LLM's)."""
    from flexlamps.engine.caches.dense import held_dtype  # lazy (torch): `flexlamps plan` imports this module
    from flexlamps.run_plan.build import in_memory_weight_bytes  # lazy (torch): as above

    run = settings.run
    dtype = run.resolve_dtype(reader)
    budgets = _offload_budgets(run)
    # in memory: each weight as its kind holds it there (a GGUF's blocks as codes, Q4_K at 4.625
    # bits a weight where our kernel keeps its scales, a dense twin where prompts do not run on them)
    weights = None if budgets is not None else in_memory_weight_bytes(reader, dtype)
    held = held_dtype(dtype, "cpu")  # a bf16 run's cache is bf16 (2 bytes), fp16's fp32
    planned = planned_rss_bytes(model, None, offload_budgets=budgets,
                                num_sequences=min(num_prompts, run.max_batch_size),
                                context_len=min(reader.config.max_position, 512 + settings.max_new_tokens),
                                cache_bytes_per_value=held.itemsize, weight_bytes=weights)
    if planned > max_rss:
        mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
        what = ("the tier budgets --gpu-mem + --cpu-mem" if budgets is not None else
                "the weights and a cache for the batch; --gpu-mem and --cpu-mem bound them")
        raise click.ClickException(
            f"--max-rss {mib(max_rss)} cannot be met: the run plans {mib(planned)} "
            f"({overheads_text(model, mib, budgets is not None)} plus {what}); lower the budgets or raise --max-rss")
