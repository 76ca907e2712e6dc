"""The whole process's planned memory, checked against `--max-rss` before the model loads.

Tier budgets bound what the offload engine holds; the process also holds a fixed overhead
that no budget sees: the Python interpreter and torch (about 230 MiB on CPU), the checkpoint
reader and tokenizer, and the engine's working buffers.
"""

from __future__ import annotations

import dataclasses

import click

from quant.int4_layout import int4_bits_per_weight

# measured with the built-in SmolLM2-135M on CPU (README "Memory"): peak RSS minus tier peaks
FIXED_OVERHEAD_BYTES = 450 * 2**20
# bytes per weight as the engine holds it; "auto" is 4-bit in place for a 4-bit GGUF (codes and
# block scales: 5 bits with (scale, zero) pairs, 4.625 with Q4_K's scales as the file has them where
# our kernel runs, `quant.int4_layout`) plus the in-memory executor's bf16 copy for prefill (see
# run_plan.build.DENSE_TWINS_MAX_SHARE), int8 in place for a Q8_0 / 5-bit GGUF (1.25 bytes, quant.int8_weight;
# 1.5 for Q6_K's groups of 16 as the split, 0.875 in the 6-bit form with its scales alone where our
# kernel runs, `in_place.packs_six_bit`) plus that copy, else float32. Where this process runs prompts on the
# codes too (`coded_weights.prompts_run_on_codes`), no copy is made and none is charged.
_WEIGHT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
_TWIN_BYTES = 2.0  # the bf16 copy within each "auto" figure
_AUTO_INT4_BYTES = _TWIN_BYTES + int4_bits_per_weight(k_scales=False) / 8  # 2.625
_AUTO_INT4_K_BYTES = _TWIN_BYTES + int4_bits_per_weight(k_scales=True) / 8  # 2.578125
_AUTO_INT8_BYTES = 3.25
_AUTO_INT8_G16_BYTES = 3.5
_AUTO_SIX_BIT_BYTES = 2.875  # Q6_K in the 6-bit form: codes 0.75, a 16-bit scale a group of 16 (quant.int8_weight)


def planned_rss_bytes(model, weight_bytes_per_param: float, *, offload_budgets: tuple[int, int] | None,
                      num_sequences: int, context_len: int, cache_bytes_per_value: int = 4) -> int:
    """Fixed overhead plus what the run's data may take: with offloading the two tier budgets
    (caps the engine enforces), else every weight of `model` (the run's `placement.ModelSpec`) and
    a full cache for `num_sequences`, its keys and values `cache_bytes_per_value` bytes each (the
    dtype the dense cache holds)."""
    if offload_budgets is not None:
        return FIXED_OVERHEAD_BYTES + sum(offload_budgets)
    spec = dataclasses.replace(model, dtype="fp32")
    weights = spec.total_weight_bytes() / 4 * weight_bytes_per_param
    cache = spec.cache_bytes_per_token_per_layer() / 4 * cache_bytes_per_value
    state = spec.state_bytes_per_sequence_per_layer()  # a hybrid model's DeltaNet states (fp32 bound)
    return int(FIXED_OVERHEAD_BYTES + weights + (cache * context_len + state) * spec.num_layers * num_sequences)


def cpu_mem_within(max_rss: int, gpu_mem: int, gpu_is_host: bool) -> int:
    """The cpu tier a memory cap leaves the offload engine: the cap less the fixed overhead and,
    where the gpu tier is host memory (no GPU), the gpu tier (`--max-rss` with `--gpu-mem` and no
    `--cpu-mem`: the whole cap goes to the engine, as a peer's page cache would take it)."""
    return max_rss - FIXED_OVERHEAD_BYTES - (gpu_mem if gpu_is_host else 0)


def fill_cap(run, max_rss: int, gpu_is_host: bool):
    """`run` with its cpu tier what `max_rss` leaves (`cpu_mem_within`), and the line that says so;
    unchanged (and None) unless offloaded with a gpu tier given and the cpu tier not."""
    if not run.offloaded or run.gpu_mem is None or run.cpu_mem is not None:
        return run, None
    mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
    cpu_mem = cpu_mem_within(max_rss, run.gpu_mem, gpu_is_host)
    if cpu_mem <= 0:
        raise click.ClickException(
            f"--max-rss {mib(max_rss)} leaves no cpu tier after the fixed overhead ({mib(FIXED_OVERHEAD_BYTES)})"
            + (f" and --gpu-mem {mib(run.gpu_mem)} (host memory here)" if gpu_is_host else "")
            + "; raise --max-rss or lower --gpu-mem")
    line = (f"cpu tier {mib(cpu_mem)}: what --max-rss {mib(max_rss)} leaves after the fixed overhead "
            f"({mib(FIXED_OVERHEAD_BYTES)})" + (" and the gpu tier (host memory here)" if gpu_is_host else ""))
    return dataclasses.replace(run, cpu_mem=cpu_mem), line


def _offload_budgets(run) -> tuple[int, int] | None:
    if not run.offloaded:
        return None
    run = run.with_budgets()
    return run.gpu_mem, run.cpu_mem  # the defaults are LLM's: one definition, in RunSettings


def _auto_bytes_per_param(reader, twins: bool = True, six_bit: bool = False, k_scales: bool = False) -> float:
    """`--dtype auto`'s bytes per weight: int8 in place where any layer holds Q8_0 / Q5_x / Q6_K
    blocks (the larger figure, so a file mixing them with 4-bit blocks, a Q4_K_M, is not
    under-planned; Q6_K's the largest as the split, below Q8_0's in the 6-bit form), else 4-bit in
    place (Q4_K's scales where every 4-bit layer block is Q4_K and `k_scales`, else pairs), else
    float32; without the dense copies (`twins` False) where prompts run on the codes; `six_bit` /
    `k_scales`: whether Q6_K is held in the 6-bit form / Q4_K with its scales
    (`in_place.packs_six_bit` / `keeps_k_scales`)."""
    kinds = getattr(reader, "layer_block_kinds", set())
    if "int8-g16" in kinds:
        per_param = _AUTO_SIX_BIT_BYTES if six_bit else _AUTO_INT8_G16_BYTES
        per_param = max(per_param, _AUTO_INT8_BYTES) if "int8" in kinds else per_param
    elif "int8" in kinds:
        per_param = _AUTO_INT8_BYTES
    elif "int4" in kinds or getattr(reader, "has_int4_weights", False):
        per_param = _AUTO_INT4_K_BYTES if k_scales and "int4-k" in kinds else _AUTO_INT4_BYTES
    elif getattr(reader, "has_quantized_weights", False):
        per_param = _AUTO_INT8_BYTES
    else:
        return 4.0
    return per_param if twins else per_param - _TWIN_BYTES


def check_max_rss(settings, max_rss: int, num_prompts: int, reader, model) -> None:
    """Refuse (before loading the weights) a run whose planned memory exceeds `max_rss`; `reader`
    and `model`: the run's checkpoint reader and its `placement.ModelSpec` (an unprepared LLM's)."""
    from flexlamps.engine.caches.dense import held_dtype  # lazy (torch): `flexlamps plan` imports this module
    from flexlamps.models.blocks.coded_weights import native_kernel, prompts_run_on_codes  # lazy (torch): as above

    run = settings.run
    dtype = run.resolve_dtype(reader)
    # Q6_K in the 6-bit form, Q4_K with its scales, wherever our decode kernel runs (the rule of
    # `in_place.packs_six_bit` and `keeps_k_scales`)
    native = native_kernel() is not None
    per_param = _WEIGHT_BYTES.get(run.dtype) or _auto_bytes_per_param(
        reader, twins=not prompts_run_on_codes(dtype), six_bit=native, k_scales=native)
    budgets = _offload_budgets(run)
    held = held_dtype(dtype, "cpu")  # a bf16 run's cache is bf16 (2 bytes), fp16's fp32
    planned = planned_rss_bytes(model, per_param, offload_budgets=budgets,
                                num_sequences=min(num_prompts, run.max_batch_size),
                                context_len=min(reader.config.max_position, 512 + settings.max_new_tokens),
                                cache_bytes_per_value=held.itemsize)
    if planned > max_rss:
        mib = lambda n: f"{n / 2**20:.0f} MiB"  # noqa: E731
        what = ("the tier budgets --gpu-mem + --cpu-mem" if budgets is not None else
                "the weights and a cache for the batch; --gpu-mem and --cpu-mem bound them")
        raise click.ClickException(
            f"--max-rss {mib(max_rss)} cannot be met: the run plans {mib(planned)} (fixed overhead "
            f"{mib(FIXED_OVERHEAD_BYTES)} plus {what}); lower the budgets or raise --max-rss")
