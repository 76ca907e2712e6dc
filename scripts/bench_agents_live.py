"""Agents with real tools, live on the augmented engine: Self-Debugging (HumanEval) and
program-aided GSM8K under each policy (lamps, infercept, fcfs, lamps-ts), on one engine in memory
and offloaded, side by side with running the same tasks one at a time (each task alone, in turn).

Prints per engine, workload and policy: E2E mean / p99 (all tasks arrive at once), throughput
(tasks per second of wall time) and its ratio to one at a time, tool calls and seconds, KV bytes
swapped to the cpu tier, preserve / swap / discard counts, and pass@1 by round (self-debug) or
accuracy (GSM8K); and whether every policy wrote the same text as the tasks run alone (float32:
scheduling never changes text). Wall-clock figures: on a shared machine they move with its load.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_agents_live.py --tasks 3 --rounds 2
"""

import argparse
import os
import tempfile

import numpy as np

from flexlamps.agents.run import LiveSettings, run_tasks
from flexlamps.agents.workloads import load_workload
from flexlamps.api import LLM
from flexlamps.engine.augmented.run import AgentsConfig, measure_cost
from flexlamps.settings import AugmentedSettings

DATA = os.environ.get("FLEXLAMPS_SHARED_DATA") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")
POLICIES = ("lamps", "infercept", "fcfs", "lamps-ts")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", type=int, default=3, help="tasks per workload")
    p.add_argument("--rounds", type=int, default=2, help="rounds (self-debug) / calls (gsm8k) per task")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--pool-contexts", type=float, default=2.0, help="gpu KV pool, in full contexts (in memory)")
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--gpu-mem", default="400MiB", help="offloaded engine: gpu tier budget")
    p.add_argument("--cpu-mem", default="2GiB", help="offloaded engine: cpu tier budget")
    p.add_argument("--schedulers", "--policies", dest="policies", default=",".join(POLICIES),
                   help="scheduling policies, comma-separated (--policies: the same)")
    a = p.parse_args()
    workloads = {
        "self-debug": load_workload("self-debug", os.path.join(DATA, "humaneval", "HumanEval.jsonl.gz"),
                                    rounds=a.rounds, limit=a.tasks, tool_timeout=10),
        "gsm8k": load_workload("gsm8k", os.path.join(DATA, "gsm8k", "test.jsonl"), rounds=a.rounds,
                               limit=a.tasks, tool_timeout=5),
    }
    ctx = max(w.context_for(a.max_new_tokens, a.rounds) for w in workloads.values())
    live = LiveSettings(max_new_tokens=a.max_new_tokens, max_context=ctx, workers=2)
    shape = dict(block_size=16, max_num_seqs=a.max_num_seqs, max_num_batched_tokens=256)
    rows = []
    for mode in ("in memory", "offloaded"):
        llm, config = _engine(a, mode, ctx, shape)
        cost = measure_cost(llm.executor, config, ctx)
        for name, workload in workloads.items():
            alone = _one_at_a_time(mode, llm, workload, config, cost, live)
            rows.append(alone)
            _print(rows[-1:], header=not rows[:-1])
            for policy in a.policies.split(","):
                run = run_tasks(llm.executor, llm.tokenizer, workload.make_tasks(), policy, config, cost, live)
                rows.append(_row(mode, name, policy, [r.e2e for r in run.result.records], run.result.end_time,
                                 run, workload.score(run.tasks), alone))
                _print(rows[-1:], header=False)
        llm.close()
    print("\nall runs:")
    _print(rows, header=True)


def _engine(a, mode: str, ctx: int, shape: dict):
    if mode == "in memory":
        llm = LLM(a.model, dtype="float32")
        per_token = llm.config.kv_bytes_per_token(4)
        gpu = int(a.pool_contexts * (ctx + 16) * per_token)
        return llm, AgentsConfig(gpu_kv_bytes=gpu, cpu_swap_bytes=2 * ctx * per_token, **shape)
    llm = LLM(a.model, dtype="float32", gpu_mem=a.gpu_mem, cpu_mem=a.cpu_mem,
              offload_dir=tempfile.mkdtemp(prefix="bench-agents-live-"))
    config = llm.prepare_augmented(AugmentedSettings(max_context=ctx, **shape)).pools
    print(f"offloaded: {' | '.join(llm.policy_lines())}; gpu KV pool {config.gpu_kv_bytes >> 20} MiB, "
          f"cpu swap pool {config.cpu_swap_bytes >> 20} MiB")
    return llm, config


def _one_at_a_time(mode, llm, workload, config, cost, live) -> dict:
    """Each task alone, in turn: task i finishes after the runs of tasks 1..i."""
    tasks, walls, tokens = workload.make_tasks(), [], {}
    for task in tasks:
        run = run_tasks(llm.executor, llm.tokenizer, [task], "fcfs", config, cost, live)
        walls.append(run.result.end_time)
        tokens.update(run.result.tokens)
    row = _row(mode, workload.name, "alone", list(np.cumsum(walls)), sum(walls), None, workload.score(tasks), None)
    row["tokens"] = tokens
    return row


def _row(mode, workload, policy, e2e, makespan, run, score, alone) -> dict:
    row = {"mode": mode, "workload": workload, "policy": policy, "e2e_mean": float(np.mean(e2e)),
           "e2e_p99": float(np.percentile(e2e, 99)), "tasks_per_s": len(e2e) / makespan, "score": score}
    if run is not None:
        res = run.result
        row.update(swapped=res.swapped_out_bytes, psd=dict(res.stats.strategies),
                   calls=sum(r.num_calls for r in res.records), tool_s=sum(r.api_seconds for r in res.records),
                   speedup=row["tasks_per_s"] / alone["tasks_per_s"], same_text=res.tokens == alone["tokens"])
    return row


def _print(rows, header: bool) -> None:
    if header:
        print(f"{'engine':10s} {'workload':10s} {'policy':10s} {'E2E mean':>9s} {'p99':>7s} {'tasks/s':>8s} "
              f"{'x alone':>7s} {'calls':>5s} {'tool s':>6s} {'swapped':>8s} {'P/S/D':>8s} {'text':>5s}  score")
    for r in rows:
        psd = "/".join(str(r["psd"][k]) for k in ("preserve", "swap", "discard")) if "psd" in r else "-"
        score = r["score"]
        score = (" ".join(f"r{i + 1} {v:.2f}" for i, v in enumerate(score["pass_at_round"]))
                 if "pass_at_round" in score else f"acc {score['accuracy']:.2f}")
        print(f"{r['mode']:10s} {r['workload']:10s} {r['policy']:10s} {r['e2e_mean']:9.2f} {r['e2e_p99']:7.2f} "
              f"{r['tasks_per_s']:8.3f} {r.get('speedup', 1.0):7.2f} {r.get('calls', '-')!s:>5s} "
              f"{r.get('tool_s', 0.0):6.2f} {r.get('swapped', 0) / 2**20:7.1f}M {psd:>8s} "
              f"{'same' if r.get('same_text', True) else 'DIFF':>5s}  {score}")


if __name__ == "__main__":
    main()
