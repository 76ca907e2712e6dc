"""Writes a run folder in HELM's own layout: `<output>/runs/<suite>/<run_name>/` with the eight
files crfm-helm's `helm-summarize` and `helm-server` read. Every file is written to a temporary
name and renamed, so a folder never holds a half-written file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flexlamps.evals.adapter_spec import MULTIPLE_CHOICE_PARTIAL, MULTIPLE_CHOICE_SEPARATE
from flexlamps.evals.instances import Scenario
from flexlamps.evals.requests import RequestState
from flexlamps.evals.run_specs import RunSpec
from flexlamps.evals.stats import Stat
from flexlamps.io.atomic import atomic_output

RUN_FILES = (
    "run_spec.json", "scenario.json", "scenario_state.json", "stats.json", "per_instance_stats.json",
    "instances.json", "display_predictions.json", "display_requests.json",
)


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def run_dir(output_path: Path, suite: str, run_name: str) -> Path:
    return Path(output_path) / "runs" / suite / run_name


def _display(spec: RunSpec, states: list[RequestState], per_instance: list[tuple[int, str, list[Stat]]]):
    """HELM's display files: one prediction and one request per (instance, trial); for separate
    multiple choice, the request of the predicted choice."""
    stats_by_key = {(t, iid): {s.name: s.mean for s in sts} for t, iid, sts in per_instance}
    shown = set(spec.metrics) | {"num_prompt_tokens", "num_output_tokens", "inference_runtime", "predicted_index"}
    instances, predictions, requests = {}, [], []
    for st in states:
        key = (st.train_trial_index, st.instance.id)
        stats = stats_by_key.get(key, {})
        if spec.adapter_spec.method in (MULTIPLE_CHOICE_SEPARATE, MULTIPLE_CHOICE_PARTIAL) and stats.get("predicted_index") != st.reference_index:
            continue
        if any(p["instance_id"] == st.instance.id and p["train_trial_index"] == st.train_trial_index
               for p in predictions[-1:]):
            continue  # several requests of one instance (document pieces): show the first
        text = st.result.completions[0].text
        mapped = st.output_mapping.get(text.strip()) if st.output_mapping else None
        instances.setdefault(st.instance.id, st.instance.to_json())
        predictions.append({
            "instance_id": st.instance.id,
            "train_trial_index": st.train_trial_index,
            "predicted_text": text,
            "truncated_predicted_text": None,
            "base64_images": [],
            "mapped_output": mapped,
            "reference_index": st.reference_index,
            "stats": {k: v for k, v in stats.items() if k in shown and v is not None},
        })
        requests.append({"instance_id": st.instance.id, "train_trial_index": st.train_trial_index,
                         "request": asdict(st.request)})
    return list(instances.values()), predictions, requests


def write_run(path: Path, spec: RunSpec, scenario: Scenario, states: list[RequestState],
              per_instance: list[tuple[int, str, list[Stat]]], stats: list[Stat]) -> None:
    """Writes the run folder; `stats.json` last, since its presence marks a finished run."""
    path = Path(path)
    instances, predictions, requests = _display(spec, states, per_instance)
    write_json_atomic(path / "run_spec.json", spec.to_json())
    write_json_atomic(path / "scenario.json", scenario.to_json())
    write_json_atomic(path / "scenario_state.json", {
        "adapter_spec": spec.adapter_spec.to_json(),
        "request_states": [s.to_json() for s in states],
    })
    write_json_atomic(path / "per_instance_stats.json", [
        {"instance_id": iid, "train_trial_index": t, "stats": [s.to_json() for s in sts]}
        for t, iid, sts in per_instance
    ])
    write_json_atomic(path / "instances.json", instances)
    write_json_atomic(path / "display_predictions.json", predictions)
    write_json_atomic(path / "display_requests.json", requests)
    write_json_atomic(path / "stats.json", [s.to_json() for s in stats])
