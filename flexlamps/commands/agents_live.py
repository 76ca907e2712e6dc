"""`flexlamps agents --self-debug / --gsm8k / --tools`: agent tasks whose tools really run, on the
augmented engine under each policy. Writes OUT/<policy>.jsonl (a record per task) and
OUT/summary.json, each atomically; a policy already in OUT's summary with the same settings is
not run again (an interrupted run resumes at the next policy)."""

from __future__ import annotations

import json
import os

import click

from flexlamps.agents.api import measure_cost
from flexlamps.agents.report import policy_summary, print_table, task_records, write_json_atomic, write_jsonl_atomic
from flexlamps.agents.run import LiveSettings, run_tasks
from flexlamps.agents.selfdebug import recheck_records
from flexlamps.commands.agents_setup import load_planned


def run_live(*, workload, run, augmented, schedulers, max_new_tokens, rounds, tool_workers, out_dir: str,
             recheck: bool) -> None:
    """Each scheduling policy in `schedulers` over `workload`'s tasks, on the model `run`
    (RunSettings) planned for `augmented` (AugmentedSettings)."""
    max_context = augmented.max_context
    try:
        live = LiveSettings(max_new_tokens=max_new_tokens, max_context=max_context, workers=tool_workers)
        llm, plan = load_planned(run, augmented)
    except ValueError as e:
        raise click.ClickException(str(e))
    key = {"workload": workload.name, "model": run.model, "dtype": run.dtype, "tasks": len(workload.make_tasks()),
           "rounds": rounds, "live": live.__dict__, "config": plan.pools.to_json()}
    summary_path = os.path.join(out_dir, "summary.json")
    done = _previous(summary_path, key)
    click.echo(f"{workload.name}: {key['tasks']} tasks, context cap {max_context}, measuring the cost model ...")
    cost = measure_cost(llm.executor, plan.pools, max_context)
    for policy in schedulers:
        if policy in done:
            click.echo(f"{policy}: already in {summary_path}, kept")
            continue
        tasks = workload.make_tasks()
        try:
            result = run_tasks(llm.executor, llm.tokenizer, tasks, policy, plan.pools, cost, live,
                               on_finish=_progress(policy, len(tasks)))
        except ValueError as e:
            raise click.ClickException(str(e))
        write_jsonl_atomic(os.path.join(out_dir, f"{policy}.jsonl"), task_records(result))
        done[policy] = policy_summary(result, workload.score)
        write_json_atomic(summary_path, {"settings": key, "policies": done})
    llm.close()
    print_table([done[p] for p in schedulers], click.echo)
    checks = _checks(workload.name, out_dir, schedulers, run.dtype, recheck)
    write_json_atomic(summary_path, {"settings": key, "policies": done, "checks": checks})
    click.echo(f"wrote {summary_path} and {', '.join(p + '.jsonl' for p in schedulers)}")
    if checks.get("recheck_mismatches"):
        raise click.ClickException(f"{len(checks['recheck_mismatches'])} recorded results differ when their "
                                   "programs run again (see summary.json)")


def _previous(path: str, key: dict) -> dict:
    """Policies a previous run with the same settings already finished (their summaries)."""
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    return dict(old.get("policies", {})) if old.get("settings") == json.loads(json.dumps(key)) else {}


def _progress(policy: str, total: int):
    """A callback printing each finished task's count (one line per task: readable in logs too)."""
    count = [0]

    def tick(record) -> None:
        count[0] += 1
        click.echo(f"{policy}: {count[0]}/{total} tasks done ({record.request_id}, {record.e2e:.1f} s)")

    return tick


def _checks(workload: str, out_dir: str, policies: list[str], dtype: str, recheck: bool) -> dict:
    """Self-debug: whether every policy ran the same programs (float32 scheduling never changes
    text), and with `recheck`, every recorded pass/fail against running its program again."""
    if workload != "self-debug":
        return {}

    records = {p: _read_jsonl(os.path.join(out_dir, f"{p}.jsonl")) for p in policies}
    programs = {p: [[rd["program"] for rd in r["rounds"]] for r in recs] for p, recs in records.items()}
    same = all(v == programs[policies[0]] for v in programs.values())
    click.echo(f"programs identical under every policy: {'yes' if same else 'NO'}"
               + ("" if same or dtype == "float32" else f" (expected in float32 only; this run is {dtype})"))
    out = {"programs_identical": same}
    if recheck:
        mismatches = [m for p, recs in records.items() for m in recheck_records(recs, p)]
        click.echo(f"recheck: {sum(len(r['rounds']) for recs in records.values() for r in recs)} programs run "
                   f"again, {len(mismatches)} differ from their record")
        out["recheck_mismatches"] = mismatches
    return out


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
