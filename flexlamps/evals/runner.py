"""One evaluation run end to end: scenario -> requests -> engine -> stats -> HELM run folder.

A finished run (its `stats.json` written under the same configuration) is skipped when asked
again; an interrupted one resumes from its progress log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from flexlamps import fault_points
from flexlamps.evals.adapters import adapt
from flexlamps.evals.executor import Executor, ProgressLog
from flexlamps.evals.helm_output import run_dir, write_json_atomic, write_run
from flexlamps.evals.identity import run_fingerprint
from flexlamps.evals.instances import Scenario
from flexlamps.evals.run_specs import RunSpec
from flexlamps.evals.scoring import group_by_instance, instance_stats, run_stats
from flexlamps.evals.stats import Stat, single

PROGRESS_FILE = ".flexlamps_progress.jsonl"
MARKER_FILE = ".flexlamps_run.json"


@dataclass
class RunOutcome:
    spec: RunSpec
    path: Path
    stats: list[Stat]
    skipped: bool = False
    engine: dict = field(default_factory=dict)

    def stat(self, name: str) -> Optional[float]:
        return next((s.mean for s in self.stats if s.name == name), None)


def _read_stats(path: Path) -> list[Stat]:
    return [Stat.from_json(d) for d in json.loads((path / "stats.json").read_text())]


def _context_limit(llm) -> Optional[int]:
    config = getattr(llm, "config", None)
    for obj, name in ((llm, "max_model_len"), (config, "max_position"), (config, "max_position_embeddings")):
        v = getattr(obj, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def prompt_fitter(llm, max_tokens: int) -> Optional[Callable[[str], bool]]:
    """HELM's rule: a prompt fits when it and the longest completion fit the context window."""
    limit = _context_limit(llm)
    if limit is None:
        return None
    return lambda text: len(llm.tokenizer.encode(text)) + max_tokens <= limit


def _planned_length(llm, state) -> int:
    """Tokens of a request's row: its prompt, or a scored pair as the scorer splits it."""
    if not state.is_scored:
        return len(llm.tokenizer.encode(state.request.prompt))
    bare = "" if getattr(llm.tokenizer, "bos_token_id", 0) is not None else "\n"  # as the executor's _score
    ctx, cont = llm.score_tokens(state.context or bare, state.continuation)
    return len(ctx) + len(cont)


def prepare_engine(llm, states: list, on_prepared: Optional[Callable[[object], None]] = None) -> None:
    """Plan the engine for this run's workload before its first request (an offloaded engine's
    policy depends on it): the longest prompt (the cache holds it), the tokens generated (1 when
    scoring), the requests.
    `on_prepared(llm)` is called once the engine is ready for requests (to show the policy it runs)."""
    if not states:
        return
    prepare = getattr(llm, "prepare", None)
    if prepare is not None and getattr(llm, "executor", True) is None:
        lengths = [_planned_length(llm, s) for s in states]
        gen = max(1, max(s.request.max_tokens for s in states))
        scoring = any(s.is_scored for s in states)
        prepare(prompt_len=max(1, max(lengths)), gen_len=gen, num_sequences=len(states),
                **({"scoring": True} if scoring else {}))
    if on_prepared is not None:
        on_prepared(llm)


def execute_run(llm, spec: RunSpec, scenario: Scenario, output_path: Path, suite: str,
                make_sampling_params: Callable, batch_size: int = 32, overwrite: bool = False,
                progress: Optional[Callable[[int, int], Callable[[int], None]]] = None,
                engine_key: str = "", make_executor: Callable = Executor,
                on_prepared: Optional[Callable[[object], None]] = None) -> RunOutcome:
    """`progress(total, already_done)` returns a callback taking the number of requests just done.
    `engine_key` (identity.EngineIdentity.key) names the weights and engine settings: results in
    the progress log computed under another are not reused. `make_executor(llm,
    make_sampling_params, batch_size)` answers the requests (the Ray one shards them over workers);
    `on_prepared(llm)` is called before the first request is answered (see `prepare_engine`)."""
    path = run_dir(output_path, suite, spec.name)
    fp = run_fingerprint(spec, scenario, engine_key)
    marker = path / MARKER_FILE
    if not overwrite and (path / "stats.json").exists() and marker.exists():
        if json.loads(marker.read_text()).get("fingerprint") == fp:
            return RunOutcome(spec, path, _read_stats(path), skipped=True)
    path.mkdir(parents=True, exist_ok=True)
    log_path = path / PROGRESS_FILE
    if overwrite and log_path.exists():
        log_path.unlink()
    write_json_atomic(marker, {"fingerprint": fp, "finished": False})

    states = adapt(spec.adapter_spec, scenario.instances, seed_offset=spec.seed,
                   fits=prompt_fitter(llm, spec.adapter_spec.max_tokens))
    log = ProgressLog(log_path, engine_key)
    already = log.load(states)
    callback = progress(len(states), already) if progress else None
    prepare_engine(llm, [s for s in states if s.result is None], on_prepared)
    make_executor(llm, make_sampling_params, batch_size).run(states, log, callback)

    per_instance = [(t, iid, instance_stats(spec, sts)) for (t, iid), sts in group_by_instance(states).items()]
    stats = run_stats(spec, per_instance)
    engine = engine_stats(states, resumed=already)
    split = per_instance[0][2][0].split if per_instance else "test"
    stats += [single(k, v, split) for k, v in engine.items() if v is not None]
    write_run(path, spec, scenario, states, per_instance, stats)
    fault_points.reached("helm_run_written")
    write_json_atomic(marker, {"fingerprint": fp, "finished": True})
    return RunOutcome(spec, path, stats, engine=engine)


def engine_stats(states, resumed: int = 0) -> dict:
    """Run-level efficiency over the whole run, however many invocations it took: engine time is
    the sum of its batches' times, token counts and prefill counters the sums over its requests."""
    wall = sum(s.result.request_time or 0.0 for s in states)
    out_tokens = sum(len(s.result.completions[0].tokens) for s in states if not s.is_scored)
    prompt_tokens = sum(s.result.num_prompt_tokens or 0 for s in states)
    eng = {
        "run_wall_time": wall,
        "num_requests": float(len(states)),
        "num_requests_resumed": float(resumed),
        "total_prompt_tokens": float(prompt_tokens),
        "total_output_tokens": float(out_tokens),
        "prompt_tokens_per_second": prompt_tokens / wall if wall > 0 else 0.0,
        "output_tokens_per_second": out_tokens / wall if wall > 0 else 0.0,
        "requests_per_second": len(states) / wall if wall > 0 else 0.0,
        "prefill_tokens_requested": None,
        "prefill_tokens_computed": None,
        "prefill_reuse_factor": None,
    }
    shares = [(s.result.prefill_requested_share, s.result.prefill_computed_share) for s in states]
    if states and all(r is not None and c is not None for r, c in shares):
        req, comp = round(sum(r for r, _ in shares)), round(sum(c for _, c in shares))
        eng.update(prefill_tokens_requested=float(req), prefill_tokens_computed=float(comp),
                   prefill_reuse_factor=req / comp if comp else None)
    return eng
