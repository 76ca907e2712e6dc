"""`flexlamps helm`: HELM-style offline evaluations, written as HELM run folders."""

from __future__ import annotations

from pathlib import Path

import click

from flexlamps.evals.scenarios import ScenarioError


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
    from flexlamps import LLM

    return LLM(model, dtype=dtype, **llm_args)


def sampling_params_factory():
    from flexlamps import SamplingParams

    return SamplingParams


def _parse_llm_args(pairs: tuple[str, ...]) -> dict:
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq:
            raise click.BadParameter(f"{p!r}: write KEY=VALUE, e.g. gpu_mem=2GiB", param_hint="--llm-arg")
        out[key] = value
    return out


@click.command("helm")
@click.option("--model", default="smollm2-135m", show_default=True,
              help="Model: a built-in name, a Hugging Face folder or a .gguf file.")
@click.option("--scenario", "scenarios", multiple=True, metavar="NAME[:K=V,...]",
              help="Scenario to run, repeatable, e.g. mmlu:subject=anatomy or arc:subset=challenge,method=cloze.")
@click.option("--scenario-file", "scenario_files", multiple=True, type=click.Path(dir_okay=False),
              help="A JSONL file of multiple-choice or generation instances (see docs/helm.md), repeatable.")
@click.option("--suite", default="flexlamps", show_default=True, help="Suite name: runs go to OUTPUT/runs/SUITE/.")
@click.option("--output-path", default="benchmark_output", show_default=True, type=click.Path(file_okay=False),
              help="HELM's benchmark_output folder.")
@click.option("--max-eval-instances", type=click.IntRange(min=1), default=None,
              help="Evaluate at most N instances per run (the first N of the eval split).")
@click.option("--num-shots", type=click.IntRange(min=0), default=None,
              help="In-context examples per prompt (default: the scenario's HELM/lighteval default).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Generation length for generation runs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Offsets the seed that draws in-context examples.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder of benchmark files (default: $FLEXLAMPS_DATA or ../shared/data).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Requests handed to the engine at once (also the resume granularity).")
@click.option("--dtype", default="float32", show_default=True)
@click.option("--llm-arg", "llm_args", multiple=True, metavar="KEY=VALUE", help="Extra LLM(...) argument, repeatable.")
@click.option("--overwrite", is_flag=True, help="Redo finished runs instead of skipping them.")
def command(model, scenarios, scenario_files, suite, output_path, max_eval_instances, num_shots, max_tokens, seed,
            data_dir, batch_size, dtype, llm_args, overwrite):
    """Run evaluations and write HELM run folders that `helm-summarize` reads.

    \b
    Example:
      flexlamps helm --scenario mmlu:subject=anatomy --scenario demo \\
          --suite s1 --max-eval-instances 50 --num-shots 5
    """
    from tqdm import tqdm

    from flexlamps.evals.helm_env import helm_model_name, write_helm_env
    from flexlamps.evals.runner import execute_run
    from flexlamps.evals.scenarios import load_scenario
    from flexlamps.evals.summary import format_table, summary_rows, write_summary
    from flexlamps.evals.run_specs import build_run_spec, parse_scenario_arg

    if not scenarios and not scenario_files:
        raise click.UsageError("give at least one --scenario or --scenario-file (try --scenario demo)")
    helm_model = helm_model_name(model)
    extra = _parse_llm_args(llm_args)
    llm = LazyLLM(lambda: load_llm(model, dtype, extra))
    output = Path(output_path)
    jobs = []
    try:
        for text in scenarios:
            name, args = parse_scenario_arg(text)
            jobs.append((name, args, load_scenario(name, args, Path(data_dir) if data_dir else None)))
        for f in scenario_files:
            scen = load_scenario("file", {"path": f, "name": Path(f).stem})
            # multiple choice has wrong options; generation lists only correct answers (aliases)
            multiple_choice = any(not r.is_correct for i in scen.instances for r in i.references)
            jobs.append(("file", {"path": f, "name": Path(f).stem,
                                  "kind": "multiple_choice" if multiple_choice else "generation"}, scen))
        specs = [build_run_spec((n, a), helm_model, num_shots, max_eval_instances, max_tokens, seed)
                 for n, a, _ in jobs]
    except ScenarioError as e:
        raise click.UsageError(str(e)) from None

    def progress(run_name):
        def start(total, done):
            bar = tqdm(total=total, initial=done, desc=run_name[:60], unit="req", leave=False)
            return bar.update
        return start

    def make_params(**kw):  # imported only when a run really generates
        return sampling_params_factory()(**kw)

    outcomes = []
    for spec, (_, _, scen) in zip(specs, jobs):
        outcome = execute_run(llm, spec, scen, output, suite, make_params, batch_size, overwrite,
                              progress(spec.name))
        outcomes.append(outcome)
        click.echo(f"{'skipped (done)' if outcome.skipped else 'wrote'} {outcome.path}", err=True)
    schema_path, prod_env = write_helm_env(output, [helm_model])
    rows = summary_rows(outcomes)
    summary_path = write_summary(output / "runs" / suite, rows)
    click.echo(format_table(rows))
    click.echo(f"\nsummary: {summary_path}\nHELM: helm-summarize --suite {suite} --output-path {output} "
               f"--schema-path {schema_path} --local-path {prod_env}", err=True)
