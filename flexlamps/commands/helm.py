"""`flexlamps helm`: HELM-style offline evaluations, written as HELM run folders."""

from __future__ import annotations

from pathlib import Path

import click

from flexlamps.commands.options import (
    ByteSize,
    check_model,
    check_offload_dir,
    check_policy,
    engine_settings,
    engine_settings_from,
    model_options,
    offload_kwargs,
    offload_options,
    ray_options,
    writable_folder,
)
from flexlamps.distributed.cluster import DistributedError
from flexlamps.distributed.helm import RayEngine
from flexlamps.evals.helm_env import helm_model_name, write_helm_env
from flexlamps.evals.identity import EngineIdentity
from flexlamps.evals.jobs import RunOptions, plan_jobs
from flexlamps.evals.metrics import missing_metric_package
from flexlamps.evals.runner import execute_run
from flexlamps.evals.scenarios import ScenarioError
from flexlamps.evals.summary import format_table, summary_rows, write_summary
from flexlamps.io.fingerprint import model_fingerprint
from flexlamps.settings import RunSettings
from offload.budget import BudgetExceededError
from placement import InfeasiblePlanError


class LazyLLM:
    """Loads the model on first use, so a call whose runs are all finished loads nothing."""

    def __init__(self, factory):
        self._factory = factory
        self._llm = None

    def __getattr__(self, name):
        if self._llm is None:
            self._llm = self._factory()
        return getattr(self._llm, name)


def load_llm(model: str, dtype: str, llm_args: dict):
    from flexlamps import LLM  # lazy (torch): `flexlamps helm` plans its runs without torch

    return LLM(model, dtype=dtype, **llm_args)


def sampling_params_factory():
    from flexlamps import SamplingParams  # lazy (torch): as load_llm

    return SamplingParams


def _parse_llm_args(pairs: tuple[str, ...]) -> dict:
    """KEY=VALUE pairs as LLM(...) keyword arguments, each value read with the type of LLM's own
    option of that name (RunSettings' field): integers, booleans (true/false, 1/0, yes/no), sizes
    for gpu_mem / cpu_mem, none for an option that may be None; an unknown key is named."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(RunSettings)
    known = [f.name for f in dataclasses.fields(RunSettings) if f.name not in ("model", "dtype")]
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        key = key.strip()
        if not eq:
            raise click.BadParameter(f"{p!r}: write KEY=VALUE, e.g. max_batch_size=64", param_hint="--llm-arg")
        if key in ("model", "dtype"):
            raise click.BadParameter(f"{key}: give it as --{key}", param_hint="--llm-arg")
        if key not in known:
            raise click.BadParameter(f"unknown key {key!r}; LLM's options: {', '.join(known)}", param_hint="--llm-arg")
        out[key] = _typed_value(key, value.strip(), hints[key])
    return out


def _typed_value(key: str, value: str, hint):
    import typing

    args = typing.get_args(hint)
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if (type(None) in args or base is object) and value.lower() in ("none", "null"):
        return None
    kind = ByteSize() if key in ("gpu_mem", "cpu_mem") else {bool: click.BOOL, int: click.INT}.get(base)
    if kind is None:
        return value
    try:
        return kind.convert(value, None, None)
    except click.BadParameter as e:
        raise click.BadParameter(f"{key}={value!r}: {e.message}", param_hint="--llm-arg") from None


@click.command("helm")
@model_options
@offload_options
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME[:K=V,...]",
              help="Scenario to run, repeatable, e.g. mmlu:subject=anatomy, arc:subset=challenge,method=cloze or "
                   "file:path=F.jsonl,metric=acc,prompt_template=quiz.")
@click.option("--scenario-file", "scenario_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Your own JSONL file: multiple choice, partial scoring or generation (see docs/helm.md), repeatable.")
@click.option("--suite", default="flexlamps", show_default=True, help="Suite name: runs go to OUTPUT/runs/SUITE/.")
@click.option("--output-path", default="benchmark_output", show_default=True, type=click.Path(file_okay=False),
              help="HELM's benchmark_output folder.")
@click.option("--max-eval-instances", type=click.IntRange(min=1), default=None,
              help="Evaluate at most N instances per run (the first N of the eval split).")
@click.option("--num-shots", type=click.IntRange(min=0), default=None,
              help="In-context examples per prompt (default: the scenario's HELM/lighteval default).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Generation length for generation runs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Offsets the seed that draws in-context examples.")
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Folder of benchmark files (default: $FLEXLAMPS_DATA or ../shared/data).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Requests handed to the engine at once (also the resume granularity); the engine packs the "
                   "continuations of all their questions into as few forward passes as it can.")
@click.option("--llm-arg", "llm_args", multiple=True, metavar="KEY=VALUE", help="Extra LLM(...) argument, repeatable.")
@click.option("--overwrite", is_flag=True, help="Redo finished runs instead of skipping them.")
@ray_options
def command(model, dtype, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache, weight_quant,
            scenarios, scenario_files, suite, output_path, max_eval_instances, num_shots, max_tokens, seed,
            data_dir, batch_size, llm_args, overwrite, ray_address, ray_workers):
    """Run evaluations and write HELM run folders that `helm-summarize` reads.

    \b
    Example:
      flexlamps helm --scenario mmlu:subject=anatomy --scenario demo \\
          --suite s1 --max-eval-instances 50 --num-shots 5
    """
    from flexlamps.api import NonFiniteLogitsError  # lazy (torch): as load_llm

    if not scenarios and not scenario_files:
        raise click.UsageError("give at least one --scenario or --scenario-file (try --scenario demo)")
    check_model(model)
    helm_model = helm_model_name(model)
    run = engine_settings(model, dtype, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache,
                          weight_quant)
    extra = {**offload_kwargs(run), **_parse_llm_args(llm_args)}
    engine_settings_from(model, dtype, extra)  # a bad --llm-arg value fails here, not once the model loads
    opts = RunOptions(helm_model, num_shots, max_eval_instances, max_tokens, seed, Path(data_dir) if data_dir else None)
    jobs = _planned_jobs(scenarios, scenario_files, opts)
    output = writable_folder(output_path, "--output-path")
    check_offload_dir(run.offload_dir)
    check_policy(run.policy)
    llm, make_executor = _engine(model, dtype, extra, ray_address, ray_workers)
    identity = EngineIdentity(model_fingerprint(model), dtype, run.compress_weight, run.compress_cache, run.weight_quant)

    def make_params(**kw):  # imported only when a run really generates
        return sampling_params_factory()(**kw)

    outcomes = []
    show_policy = _policy_printer()
    try:
        for job in jobs:
            outcome = execute_run(llm, job.spec, job.scenario, output, suite, make_params, batch_size, overwrite,
                                  _progress(job.spec.name), engine_key=identity.key, on_prepared=show_policy,
                                  **make_executor)
            outcomes.append(outcome)
            click.echo(f"{'skipped (done)' if outcome.skipped else 'wrote'} {outcome.path}", err=True)
    except (DistributedError, InfeasiblePlanError, BudgetExceededError) as e:
        raise click.ClickException(str(e)) from None
    except NonFiniteLogitsError as e:
        raise click.ClickException(f"--model {model}: {e}") from None
    finally:
        if ray_address is not None:
            llm.close()
    _write_summaries(output, suite, helm_model, jobs, outcomes)


def _planned_jobs(scenarios, scenario_files, opts):
    """The runs to make; a bad scenario, or a metric whose package is not installed, is one line."""
    try:
        jobs = plan_jobs(scenarios, scenario_files, opts)
    except ScenarioError as e:
        raise click.UsageError(str(e)) from None
    if (why := missing_metric_package({m for job in jobs for m in job.spec.metrics})) is not None:
        raise click.ClickException(why)
    return jobs


def _write_summaries(output: Path, suite: str, helm_model: str, jobs, outcomes) -> None:
    """HELM's schema and environment files, our summary table, and the helm-summarize command."""
    schema_path, prod_env = write_helm_env(output, [helm_model], [j.spec for j in jobs])
    rows = summary_rows(outcomes)
    summary_path = write_summary(output / "runs" / suite, rows)
    click.echo(format_table(rows))
    # one thread: mako's templates compiled on several threads hit CPython 3.11's AST recursion-depth
    # race (python/cpython#106905: "SystemError: AST constructor recursion depth mismatch")
    click.echo(f"\nsummary: {summary_path}\nHELM: helm-summarize --suite {suite} --output-path {output} "
               f"--schema-path {schema_path} --local-path {prod_env} --num-threads 1", err=True)


def _policy_printer():
    """`on_prepared` for execute_run: shows the offloaded placement the engine runs (as `generate`
    does), once per command: the first run that answers requests builds the engine."""
    shown = []

    def show(llm) -> None:
        if not shown and hasattr(llm, "policy_lines"):
            shown.append(True)
            for line in llm.policy_lines():
                click.echo(line, err=True)
    return show


def _progress(run_name: str):
    def start(total, done):
        from tqdm import tqdm

        bar = tqdm(total=total, initial=done, desc=run_name[:60], unit="req", leave=False)
        return bar.update
    return start


def _engine(model: str, dtype: str, llm_args: dict, ray_address, ray_workers):
    """(the llm execute_run sees, its extra arguments): one engine here, loaded on first use,
    or with --ray a driver-side stand-in whose workers (one engine each) answer the requests."""
    if ray_address is None:
        return LazyLLM(lambda: load_llm(model, dtype, llm_args)), {}

    def on_workers(infos):
        click.echo(f"ray: {len(infos)} workers x {threads} threads on {', '.join(sorted({i['host'] for i in infos}))}",
                   err=True)

    threads = click.get_current_context().meta.get("flexlamps.threads") or 1  # per worker
    engine = RayEngine(model, dtype, llm_args, ray_address or None, ray_workers, threads, on_workers=on_workers)
    return engine, {"make_executor": engine.executor}
