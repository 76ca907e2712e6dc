"""`flexlamps eval`: lm-evaluation-harness's tasks on the flexlamps engine, written as lm_eval
writes them (its results JSON and per-sample logs), resumable.

lm_eval is an optional extra (`pip install 'flexlamps[eval]'`). Every answered part of a run goes
to lm_eval's response cache under --output-path (one per model file and engine settings), so a
killed run started again answers only what is left and writes the same results.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from flexlamps.commands.options import (check_model, check_offload_dir, check_policy, engine_settings, model_options,
                                        offload_options, writable_folder)
from flexlamps.evals.lm_eval_run import EvalOptions, run_lm_eval
from flexlamps.io.fingerprint import model_fingerprint

CACHE_FOLDER = ".flexlamps-eval-cache"
NO_LM_EVAL = "flexlamps eval needs lm-evaluation-harness, which is not installed: pip install 'flexlamps[eval]'"


def _require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise click.ClickException(NO_LM_EVAL) from None


@click.command("eval")
@model_options
@offload_options
@click.option("--tasks", required=True, help="Comma-separated lm_eval task or group names, or task YAML files.")
@click.option("--output-path", required=True, type=click.Path(file_okay=False),
              help="Folder for lm_eval's results JSON (and samples with --log-samples); also holds the response "
                   "cache a re-run resumes from.")
@click.option("--include-path", type=click.Path(exists=True), default=None,
              help="A folder (or file) of your own task YAMLs, added to lm_eval's registry.")
@click.option("--num-fewshot", type=click.IntRange(min=0), default=None, help="In-context examples per prompt.")
@click.option("--limit", type=click.FloatRange(min=0, min_open=True), default=None, help="At most this many documents per task (a value < 1: "
              "that share of them); for quick checks.")
@click.option("--log-samples", is_flag=True, help="Also write every document's prompt, responses and metrics.")
@click.option("--apply-chat-template", is_flag=True, help="Render prompts with the model's chat template.")
@click.option("--fewshot-as-multiturn/--fewshot-in-one-turn", default=True, show_default=True,
              help="With --apply-chat-template: in-context examples as turns of the conversation.")
@click.option("--system-instruction", default=None, help="A system message put before every prompt.")
@click.option("--gen-kwargs", default=None, help="Generation settings over the tasks' own, e.g. max_gen_toks=64.")
@click.option("--max-length", type=click.IntRange(min=2), default=None,
              help="Tokens a request may hold (also the rolling-perplexity window). [default: the model's context]")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Sequences decoded together; contexts packed per scoring call.")
@click.option("--seed", type=int, default=None, help="One seed for lm_eval's four (Python, numpy, torch, few-shot "
              "draws) and the base of sampled generations' seeds. [default: lm_eval's own, 0,1234,1234,1234]")
@click.option("--bootstrap-iters", type=click.IntRange(min=0), default=100000, show_default=True,
              help="Bootstrap resamples for the stderr of non-mean metrics (0: none).")
@click.option("--chunk-tokens", type=click.IntRange(min=1), default=16384, show_default=True,
              help="Tokens computed per engine call (a shared prefix once): the unit of progress and of what a killed "
                   "run keeps.")
@click.option("--overwrite", is_flag=True, help="Answer every request again instead of resuming from the cache.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bars.")
def command(model, dtype, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache, weight_quant,
            tasks, output_path, include_path, num_fewshot, limit, log_samples, apply_chat_template,
            fewshot_as_multiturn, system_instruction, gen_kwargs, max_length, batch_size, seed, bootstrap_iters,
            chunk_tokens, overwrite, no_progress):
    """Run lm-evaluation-harness TASKS on the flexlamps engine and write lm_eval's results.

    \b
    Example (a task YAML over local files, see docs/eval.md):
      flexlamps eval --tasks arc_easy_local --include-path examples/lm_eval \\
          --limit 100 --output-path eval_out
    """
    _require_lm_eval()
    check_model(model)
    run = engine_settings(model, dtype, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache,
                          weight_quant, max_batch_size=batch_size)
    check_policy(run.policy)
    check_offload_dir(run.offload_dir)
    output = writable_folder(output_path, "--output-path")
    task_names, task_manager = _tasks(tasks, include_path)
    model_args = {"pretrained": model, "dtype": dtype, "max_batch_size": batch_size, "seed": seed or 0,
                  "progress": not no_progress, "max_length": max_length, "chunk_tokens": chunk_tokens,
                  **{k: getattr(run, k) for k in ("gpu_mem", "cpu_mem", "offload_dir", "compress_weight",
                                                  "compress_cache", "weight_quant")},
                  **({} if run.policy == "auto" else {"policy": run.policy})}
    model_args = {k: v for k, v in model_args.items() if v is not None}
    cache = _response_cache(output, model_args, overwrite)

    opts = EvalOptions(num_fewshot=num_fewshot, limit=limit, log_samples=log_samples,
                       apply_chat_template=apply_chat_template, fewshot_as_multiturn=fewshot_as_multiturn,
                       system_instruction=system_instruction, gen_kwargs=gen_kwargs, seed=seed,
                       bootstrap_iters=bootstrap_iters)
    try:
        table, written = run_lm_eval(model_args, task_names, task_manager, output, cache, opts)
    except (ValueError, OSError, MemoryError) as e:  # a task's data, a generation keyword, the model's memory
        raise click.ClickException(str(e).splitlines()[0] if str(e) else repr(e)) from None
    click.echo(table)
    for path in written:
        click.echo(f"wrote {path}", err=True)


def _tasks(tasks: str, include_path):
    """(task names or configs, lm_eval's TaskManager) for --tasks, as lm_eval's CLI resolves
    them (names, groups, YAML files, globs); an unknown one is named. Tasks all found under
    --include-path skip indexing lm_eval's registry (about 14,700 YAMLs: 40 s on a 2-core box)."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    if include_path:
        _check_include_path(Path(include_path))
    local = _local_tasks(tasks, include_path)
    if local is not None:
        return local
    cfg = EvaluatorConfig(tasks=tasks, include_path=include_path)
    try:
        manager = cfg.process_tasks({})
    except ValueError as e:
        raise click.UsageError(f"--tasks: {e}; list lm_eval's tasks with `lm_eval ls tasks`, or give your "
                               "task YAMLs' folder with --include-path") from None
    return cfg.tasks, manager


def _check_include_path(path: Path) -> None:
    """--include-path names a task YAML or a folder holding one (lm_eval reads `**/*.yaml`); else
    refused before the registry's index, which every name would otherwise be looked up in."""
    found = path.suffix == ".yaml" if path.is_file() else next(path.glob("**/*.yaml"), None) is not None
    if not found:
        raise click.BadParameter(f"{path} holds no task YAML (*.yaml); give your task YAMLs' file or folder",
                                 param_hint="'--include-path'")


def _local_tasks(tasks: str, include_path):
    """(names, a TaskManager over --include-path alone) when every name is a task (not a group
    or tag, whose members may be lm_eval's own) of --include-path; else None."""
    if not include_path:
        return None
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    names = list(dict.fromkeys(t.strip() for t in tasks.split(",") if t.strip()))
    manager = TaskManager(include_path=include_path, include_defaults=False, metadata={})
    kinds = [getattr(manager.task_index.get(name), "kind", None) for name in names]
    if names and all(kind in (Kind.TASK, Kind.PY_TASK) for kind in kinds):
        return names, manager
    return None


def _response_cache(output: Path, model_args: dict, overwrite: bool) -> str:
    """lm_eval's use_cache path for this model file and the settings its numbers depend on: a
    re-run with them resumes, other settings get their own cache."""
    import hashlib

    numbers = {k: model_args.get(k) for k in ("dtype", "compress_weight", "compress_cache", "weight_quant",
                                               "max_length", "seed")}
    key = hashlib.sha256(json.dumps([model_fingerprint(model_args["pretrained"]), numbers],
                                    sort_keys=True).encode()).hexdigest()[:16]
    folder = output / CACHE_FOLDER
    folder.mkdir(exist_ok=True)
    if overwrite:
        for old in folder.glob(f"{key}_rank*.db"):
            old.unlink()
    return str(folder / key)
