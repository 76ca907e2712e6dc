"""One `flexlamps eval` run: lm_eval's `simple_evaluate` on `FlexlampsLM` with its response
cache, and the files lm_eval's own command line writes (results JSON, per-task sample logs)
through its `EvaluationTracker`. Imports lm_eval (an optional extra)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """lm_eval's evaluation options, as its command line names them."""
    num_fewshot: int | None = None
    limit: float | None = None  # documents per task; < 1: a share of them
    log_samples: bool = False
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = True
    system_instruction: str | None = None
    gen_kwargs: str | None = None
    seed: int | None = None  # one seed for all four of lm_eval's; None: lm_eval's own defaults
    bootstrap_iters: int = 100000


def run_lm_eval(model_args: dict, tasks: list, task_manager, output: Path, cache: str | None,
                opts: EvalOptions) -> tuple[str, list[Path]]:
    """Evaluate `tasks` on FlexlampsLM(**model_args); returns (lm_eval's results table, the
    files written under `output`). `cache`: lm_eval's use_cache path (None: no resuming)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import make_table

    # lazy (extra): lm_eval is the [eval] extra; this module registers "flexlamps" with it
    import flexlamps.evals.lm_eval_model  # noqa: F401

    limit = int(opts.limit) if opts.limit is not None and opts.limit >= 1 else opts.limit
    tracker = EvaluationTracker(output_path=str(output))
    before = set(output.rglob("*.json*"))
    results = lm_eval.simple_evaluate(
        model="flexlamps", model_args=model_args, tasks=tasks, task_manager=task_manager,
        num_fewshot=opts.num_fewshot, limit=limit, use_cache=cache, log_samples=opts.log_samples,
        evaluation_tracker=tracker, apply_chat_template=opts.apply_chat_template,
        fewshot_as_multiturn=opts.fewshot_as_multiturn, system_instruction=opts.system_instruction,
        gen_kwargs=opts.gen_kwargs, bootstrap_iters=opts.bootstrap_iters, **_seeds(opts.seed))
    samples = results.pop("samples", None) if opts.log_samples else None
    results.pop("samples", None)
    tracker.save_results_aggregated(results=results, samples=samples)
    if samples is not None:
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    table = make_table(results) + (make_table(results, "groups") if "groups" in results else "")
    return table, sorted(set(output.rglob("*.json*")) - before)


def _seeds(seed: int | None) -> dict:
    """simple_evaluate's four seeds: all `seed`, or where None lm_eval's defaults (its command
    line's 0,1234,1234,1234), so a run's few-shot draws are those `lm_eval` itself makes."""
    if seed is None:
        return {}
    return dict(random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed)
