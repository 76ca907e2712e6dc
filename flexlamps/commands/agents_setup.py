"""What both modes of `flexlamps agents` (a trace, live tools) start from: the augmented settings,
and the model planned and built for them through the API."""

from __future__ import annotations

import click

from flexlamps.api import LLM
from flexlamps.settings import AugmentedSettings
from placement import format_bytes


def augmented_settings(max_context: int, **fields):
    """The augmented face's settings, parsed once; a bad value is a UsageError naming it."""
    try:
        return AugmentedSettings.parse(max_context=max_context, **fields)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def load_planned(run, augmented):
    """The model, planned and built for the augmented run (`LLM.prepare_augmented`); offloaded,
    the placement and the pools its budgets leave are printed."""
    llm = LLM.from_settings(run)
    plan = llm.prepare_augmented(augmented)
    if not plan.offloaded:
        return llm, plan
    w, use, sizes = plan.policy.weights, llm.executor.tier_use(), llm.pool_sizes
    click.echo(f"placement: weights {w.gpu:.0%} gpu / {w.cpu:.0%} cpu / {w.disk:.0%} disk "
               f"({format_bytes(use['gpu'].used_bytes)} gpu, {format_bytes(use['cpu'].used_bytes)} cpu resident)")
    click.echo(f"planner: gpu KV pool {format_bytes(sizes.gpu_kv_bytes)}, cpu swap pool "
               f"{format_bytes(sizes.cpu_swap_bytes)} (budgets {format_bytes(run.gpu_mem)} / "
               f"{format_bytes(run.cpu_mem)}; working set {format_bytes(sizes.gpu_working_set)} gpu, "
               f"{format_bytes(sizes.cpu_working_set)} cpu)")
    return llm, plan
