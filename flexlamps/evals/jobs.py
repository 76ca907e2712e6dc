"""The runs one `flexlamps helm` call asks for: scenarios by name and users' files, each loaded
and checked (before any model loads) and paired with its run spec."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from flexlamps.evals.custom_file import FileSettings, load_custom_file
from flexlamps.evals.instances import Scenario
from flexlamps.evals.run_specs import RunSpec, build_run_spec, parse_scenario_arg
from flexlamps.evals.scenarios import ScenarioError, load_scenario


@dataclass
class Job:
    spec: RunSpec
    scenario: Scenario
    file_settings: Optional[FileSettings] = None  # a user's file: how it is prompted and scored


@dataclass(frozen=True)
class RunOptions:
    model: str  # HELM model name, e.g. flexlamps/smollm2-135m
    num_shots: Optional[int] = None
    max_eval_instances: Optional[int] = None
    max_tokens: Optional[int] = None
    seed: int = 0
    data_dir: Optional[Path] = None


def _file_job(args: dict, opts: RunOptions) -> Job:
    path = Path(args["path"])
    name = args.get("name", path.stem)
    overrides = {k: v for k, v in args.items() if k not in ("path", "name")}
    loaded = load_custom_file(path, name, overrides)
    loaded.scenario.assign_ids()
    spec = build_run_spec(("file", {"path": str(path), "name": name, **overrides}), opts.model, opts.num_shots,
                          opts.max_eval_instances, opts.max_tokens, opts.seed, file_settings=loaded.settings)
    return Job(spec, loaded.scenario, loaded.settings)


def plan_jobs(scenarios: tuple[str, ...], scenario_files: tuple[str, ...], opts: RunOptions) -> list[Job]:
    """Raises ScenarioError (a user's mistake, with its fix) before anything runs."""
    jobs = []
    for text in scenarios:
        name, args = parse_scenario_arg(text)
        if name == "file":
            if "path" not in args:
                raise ScenarioError("file scenario needs path=FILE (or use --scenario-file FILE)")
            jobs.append(_file_job(args, opts))
            continue
        scen = load_scenario(name, args, opts.data_dir)
        spec = build_run_spec((name, args), opts.model, opts.num_shots, opts.max_eval_instances, opts.max_tokens,
                              opts.seed)
        jobs.append(Job(spec, scen))
    for f in scenario_files:
        jobs.append(_file_job({"path": f}, opts))
    return jobs
