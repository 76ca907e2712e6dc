"""The readable end of a `flexlamps helm` call: a table on stdout and `flexlamps_summary.json` per
suite (HELM's `helm-summarize` writes its own `summary.json` in the same folder)."""

from __future__ import annotations

import json
from pathlib import Path

from flexlamps.evals.helm_output import write_json_atomic
from flexlamps.evals.runner import RunOutcome

COLUMNS = ("run", "metric", "value", "n", "prompt tok", "output tok", "wall s", "prefill reuse")


def summary_rows(outcomes: list[RunOutcome]) -> list[dict]:
    rows = []
    for o in outcomes:
        rows.append({
            "run": o.spec.name,
            "scenario": o.spec.scenario,
            "group": o.spec.groups[0],
            "method": o.spec.adapter_spec.method,
            "main_metric": o.spec.main_metric,
            "main_value": o.stat(o.spec.main_metric),
            "metrics": {m: o.stat(m) for m in o.spec.metrics},
            "num_instances": o.stat("num_instances"),
            "num_prompt_tokens": o.stat("num_prompt_tokens"),
            "num_output_tokens": o.stat("num_output_tokens"),
            "run_wall_time": o.stat("run_wall_time"),
            "output_tokens_per_second": o.stat("output_tokens_per_second"),
            "requests_per_second": o.stat("requests_per_second"),
            "prefill_tokens_requested": o.stat("prefill_tokens_requested"),
            "prefill_tokens_computed": o.stat("prefill_tokens_computed"),
            "skipped_as_done": o.skipped,
            "path": str(o.path),
        })
    return rows


def _fmt(v, digits=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.{digits}f}"
    return str(int(v)) if isinstance(v, float) else str(v)


def format_table(rows: list[dict]) -> str:
    cells = []
    for r in rows:
        req, comp = r["prefill_tokens_requested"], r["prefill_tokens_computed"]
        reuse = f"{req / comp:.2f}x" if req and comp else "-"
        cells.append((r["run"], r["main_metric"], _fmt(r["main_value"]), _fmt(r["num_instances"]),
                      _fmt(r["num_prompt_tokens"], 1), _fmt(r["num_output_tokens"], 1),
                      _fmt(r["run_wall_time"], 1), reuse))
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]
    line = lambda c: "  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip()  # noqa: E731
    return "\n".join([line(COLUMNS), line(tuple("-" * w for w in widths)), *map(line, cells)])


SUMMARY_FILE = "flexlamps_summary.json"


def write_summary(suite_dir: Path, rows: list[dict]) -> Path:
    """flexlamps_summary.json beside the run folders (helm-summarize only reads folders there);
    rows of earlier calls on the same suite are kept, a run asked again replaces its row."""
    path = Path(suite_dir) / SUMMARY_FILE
    merged: dict[str, dict] = {}
    if path.exists():
        try:
            merged = {r["run"]: r for r in json.loads(path.read_text()).get("runs", [])}
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            merged = {}  # an unreadable old summary is rebuilt from this call's runs
    merged.update({r["run"]: r for r in rows})
    write_json_atomic(path, {"runs": list(merged.values())})
    return path
