"""The two files HELM's tools need besides the runs: our schema (run groups and metrics, so the
runs appear in leaderboards) and model metadata (display names), written next to the runs."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from flexlamps.evals.helm_output import write_json_atomic

if TYPE_CHECKING:
    from flexlamps.evals.run_specs import RunSpec

SCHEMA_FILE = "schema_flexlamps.json"
PROD_ENV_DIR = "prod_env"


def read_resource(name: str) -> str:
    return resources.files("flexlamps.evals").joinpath("resources", name).read_text(encoding="utf-8")


def helm_model_name(model: str) -> str:
    """HELM names models '<organization>/<name>': ours are 'flexlamps/<file or folder stem>'."""
    stem = Path(model.rstrip("/")).name
    stem = re.sub(r"\.(gguf|safetensors)$", "", stem, flags=re.I)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "model"
    return f"flexlamps/{stem}"


def custom_run_group(spec: "RunSpec") -> dict:
    """The schema entry of a user's file's run group: its main metric (the file's) is the
    leaderboard's headline; all multiple-choice normalizations and generation matches follow."""
    what = f"Your own data: {spec.scenario_args.get('path', 'a JSONL file')} ({spec.adapter_spec.method})."
    return {
        "name": spec.groups[0],
        "display_name": f"{spec.scenario_args.get('name', 'custom')} (custom file)",
        "description": what,
        "metric_groups": ["accuracy", "multiple_choice", "generation_matches", "efficiency", "flexlamps_engine",
                          "general_information"],
        "environment": {"main_name": spec.main_metric, "main_split": "test"},
        "taxonomy": {"task": "custom", "what": what, "who": "the user", "when": "unknown", "language": "unknown"},
    }


def _merged_schema(schema_path: Path, specs: list["RunSpec"]) -> dict:
    """The shipped schema plus a run group for every user's file run, this call's and earlier
    calls' (kept from the schema already written), listed under flexlamps_scenarios."""
    schema = json.loads(read_resource(SCHEMA_FILE))
    known = {g["name"] for g in schema["run_groups"]}
    groups: dict[str, dict] = {}
    if schema_path.exists():
        try:
            old = json.loads(schema_path.read_text(encoding="utf-8"))
            groups = {g["name"]: g for g in old.get("run_groups", []) if g.get("name") not in known}
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            groups = {}  # an unreadable old schema is rebuilt from this call's runs
    groups.update({s.groups[0]: custom_run_group(s) for s in specs if s.scenario == "file"})
    schema["run_groups"] += list(groups.values())
    top = next(g for g in schema["run_groups"] if g["name"] == "flexlamps_scenarios")
    top["subgroups"] += [name for name in groups if name not in top["subgroups"]]
    return schema


def write_helm_env(output_path: Path, models: list[str], specs: Optional[list["RunSpec"]] = None) -> tuple[Path, Path]:
    """Writes `<output>/schema_flexlamps.json` (with the run groups of users' files in `specs`) and
    `<output>/prod_env/model_metadata.yaml` (the shipped entries plus one for each HELM model name
    not yet there). Returns both paths."""
    output_path = Path(output_path)
    schema_path = output_path / SCHEMA_FILE
    write_json_atomic(schema_path, _merged_schema(schema_path, list(specs or [])))
    meta_path = output_path / PROD_ENV_DIR / "model_metadata.yaml"
    # The file is JSON text, which YAML reads as is; keep entries added by earlier calls.
    source = meta_path.read_text(encoding="utf-8") if meta_path.exists() else read_resource("model_metadata.yaml")
    meta = json.loads("\n".join(line for line in source.splitlines() if not line.startswith("#")))
    known = {m["name"] for m in meta["models"]}
    for name in models:
        if name not in known:
            meta["models"].append({
                "name": name, "display_name": f"{name.split('/', 1)[1]} (flexlamps)",
                "description": f"{name.split('/', 1)[1]} served by the flexlamps offline engine.",
                "creator_organization_name": "unknown", "access": "open",
                "tags": ["TEXT_MODEL_TAG", "FULL_FUNCTIONALITY_TEXT_MODEL_TAG"],
            })
            known.add(name)
    write_json_atomic(meta_path, meta)
    return schema_path, meta_path.parent
