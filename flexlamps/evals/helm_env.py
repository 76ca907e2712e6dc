"""The two files HELM's tools need besides the runs: our schema (run groups and metrics, so the
runs appear in leaderboards) and model metadata (display names), written next to the runs."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from flexlamps.evals.helm_output import write_json_atomic

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


def write_helm_env(output_path: Path, models: list[str]) -> tuple[Path, Path]:
    """Writes `<output>/schema_flexlamps.json` and `<output>/prod_env/model_metadata.yaml` (the
    shipped entries plus one for each HELM model name not yet there). Returns both paths."""
    output_path = Path(output_path)
    schema_path = output_path / SCHEMA_FILE
    write_json_atomic(schema_path, json.loads(read_resource(SCHEMA_FILE)))
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
