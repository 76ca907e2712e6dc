"""One evaluation run end to end: scenario -> requests -> engine -> stats -> HELM run folder.

A finished run (its `stats.json` written under the same configuration) is skipped when asked
again; an interrupted one resumes from its progress log.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from flexlamps.evals.adapters import adapt
from flexlamps.evals.executor import Executor, ProgressLog
from flexlamps.evals.helm_output import run_dir, write_json_atomic, write_run
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


def fingerprint(spec: RunSpec, scenario: Scenario) -> str:
    blob = json.dumps([spec.to_json(), spec.seed, scenario.name, len(scenario.instances)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _read_stats(path: Path) -> list[Stat]:
    return [Stat.from_json(d) for d in json.loads((path / "stats.json").read_text())]


def _prefill_counters(llm) -> tuple[Optional[int], Optional[int]]:
    st = getattr(llm, "stats", None)
    return (getattr(st, "prefill_tokens_requested", None), getattr(st, "prefill_tokens_computed", None))


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


def execute_run(llm, spec: RunSpec, scenario: Scenario, output_path: Path, suite: str,
                make_sampling_params: Callable, batch_size: int = 32, overwrite: bool = False,
                progress: Optional[Callable[[int, int], Callable[[int], None]]] = None) -> RunOutcome:
    """`progress(total, already_done)` returns a callback taking the number of requests just done."""
    path = run_dir(output_path, suite, spec.name)
    fp = fingerprint(spec, scenario)
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
    log = ProgressLog(log_path)
    already = log.load(states)
    callback = progress(len(states), already) if progress else None
    fresh = [s for s in states if s.result is None]
    requested0, computed0 = _prefill_counters(llm)
    t0 = time.perf_counter()
    Executor(llm, make_sampling_params, batch_size).run(states, log, callback)
    wall = time.perf_counter() - t0
    requested1, computed1 = _prefill_counters(llm)

    per_instance = [(t, iid, instance_stats(spec, sts)) for (t, iid), sts in group_by_instance(states).items()]
    stats = run_stats(spec, per_instance)
    engine = _engine_stats(states, fresh, wall, requested0, computed0, requested1, computed1)
    split = per_instance[0][2][0].split if per_instance else "test"
    stats += [single(k, v, split) for k, v in engine.items() if v is not None]
    write_run(path, spec, scenario, states, per_instance, stats)
    write_json_atomic(marker, {"fingerprint": fp, "finished": True})
    return RunOutcome(spec, path, stats, engine=engine)


def _engine_stats(states, fresh, wall, r0, c0, r1, c1) -> dict:
    """Run-level efficiency of this invocation (requests resumed from the log are not in the
    throughput) and the engine's shared-prefix reuse counters."""
    out_tokens = sum(len(s.result.completions[0].tokens) for s in fresh if not s.is_scored)
    prompt_tokens = sum(s.result.num_prompt_tokens or 0 for s in fresh)
    eng = {
        "run_wall_time": wall,
        "num_requests": float(len(states)),
        "num_requests_resumed": float(len(states) - len(fresh)),
        "total_prompt_tokens": float(prompt_tokens),
        "total_output_tokens": float(out_tokens),
        "prompt_tokens_per_second": prompt_tokens / wall if wall > 0 else 0.0,
        "output_tokens_per_second": out_tokens / wall if wall > 0 else 0.0,
        "prefill_tokens_requested": None,
        "prefill_tokens_computed": None,
        "prefill_reuse_factor": None,
    }
    if None not in (r0, c0, r1, c1):
        req, comp = r1 - r0, c1 - c0
        eng.update(prefill_tokens_requested=float(req), prefill_tokens_computed=float(comp),
                   prefill_reuse_factor=req / comp if comp else None)
    return eng
