"""What a live agents run writes and prints: per policy a record per task (what it did and how
long it took) and a summary (latency, throughput, tool calls, memory moves, task scores)."""

from __future__ import annotations

import json
from typing import Callable

from flexlamps.agents.run import LiveRun
from flexlamps.io.atomic import atomic_output
from flexlamps.sim.metrics import summarize


def task_records(run: LiveRun) -> list[dict]:
    """One JSON record per task, in the order the tasks were given."""
    by_id = {r.request_id: r for r in run.result.records}
    out = []
    for task in run.tasks:
        rec = by_id.get(task.task_id)
        if rec is None:
            raise RuntimeError(f"{run.policy}: task {task.task_id!r} did not finish")
        out.append({**task.record(), "policy": run.policy, "e2e_s": rec.e2e, "ttft_s": rec.ttft,
                    "tool_calls": rec.num_calls, "tool_seconds": rec.api_seconds,
                    "output_tokens": rec.output_tokens})
    return out


def policy_summary(run: LiveRun, score: Callable[[list], dict]) -> dict:
    """Latency, throughput, tool use, memory moves and `score(tasks)` of one policy's run."""
    res = run.result
    s = summarize(res.records, run.policy, 0.0, res.end_time)
    return {"policy": run.policy, "tasks": s.num_requests, "e2e_mean_s": s.e2e_mean, "e2e_p50_s": s.e2e_p50,
            "e2e_p99_s": s.e2e_p99, "ttft_mean_s": s.ttft_mean, "makespan_s": res.end_time,
            "throughput_tasks_per_s": s.throughput_rps, "throughput_tokens_per_s": s.throughput_tps,
            "tool_calls": sum(r.num_calls for r in res.records),
            "tool_seconds": sum(r.api_seconds for r in res.records),
            "swapped_bytes": res.swapped_out_bytes, "strategies": dict(res.stats.strategies),
            "recompute_tokens": res.stats.recompute_tokens, "iterations": res.stats.iterations,
            **score(run.tasks)}


def write_json_atomic(path: str, obj) -> None:
    """Write `obj` as JSON to `path` through a temp file and a rename (never a torn file)."""
    _write_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_jsonl_atomic(path: str, rows: list[dict]) -> None:
    _write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def _write_atomic(path: str, text: str) -> None:
    with atomic_output(path) as f:  # the file's mode follows the umask, as a plain open's would
        f.write(text)


def print_table(summaries: list[dict], echo=print) -> None:
    """One line per policy; pass@1 by round where the workload has rounds."""
    echo(f"{'policy':10s} {'tasks':>5s} {'E2E mean':>9s} {'p99':>7s} {'tasks/s':>8s} {'tool calls':>10s} "
         f"{'tool s':>7s} {'swapped':>9s} {'P/S/D':>9s}  score")
    for s in summaries:
        st = s["strategies"]
        psd = f"{st['preserve']}/{st['swap']}/{st['discard']}"
        score = (" ".join(f"r{i + 1} {p:.3f}" for i, p in enumerate(s["pass_at_round"])) if "pass_at_round" in s
                 else f"accuracy {s['accuracy']:.3f}" if "accuracy" in s else "")
        echo(f"{s['policy']:10s} {s['tasks']:5d} {s['e2e_mean_s']:9.2f} {s['e2e_p99_s']:7.2f} "
             f"{s['throughput_tasks_per_s']:8.3f} {s['tool_calls']:10d} {s['tool_seconds']:7.2f} "
             f"{s['swapped_bytes'] / 2**20:8.1f}M {psd:>9s}  {score}")
