"""`flexlamps eval`'s model vs lm-evaluation-harness's HF backend: the same lm_eval tasks (YAMLs
over local files, examples/lm_eval), model and data, in one process at the same threads; each
task's metrics side by side (flexlamps in memory and offloaded) and each side's wall time.

The HF backend runs the built-in GGUF through transformers in float32 (`bench_eval.load_peer`);
flexlamps runs float32 too, so the two compute the same weights. Run from the repository root
(the YAMLs read ../shared/data):

    .venv/bin/pip install 'lm_eval==0.4.13'
    HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_lm_eval.py --threads 2 \\
        --task arc_easy_local:200 --task wikitext2_local:3 --task gsm8k_local:10
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flexlamps.evals.lm_eval_model import FlexlampsLM  # noqa: E402
from scripts.bench_eval import load_peer  # noqa: E402


def evaluate(lm, task: str, limit: int, manager) -> tuple[dict, float, list]:
    """(lm_eval's results for `task`, wall seconds, each document's responses)."""
    import lm_eval

    t0 = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, limit=limit, bootstrap_iters=0,
                                  log_samples=True)
    wall = time.perf_counter() - t0
    return out["results"][task], wall, [s["resps"] for s in out["samples"][task]]


def metrics(result: dict) -> dict[str, float]:
    return {k: v for k, v in result.items() if isinstance(v, float) and "stderr" not in k}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", action="append", required=True, metavar="NAME:LIMIT",
                    help="a task of examples/lm_eval and its document limit, repeatable")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=None, help="both sides (default: the model's context)")
    ap.add_argument("--batch-size", type=int, default=32, help="lm_eval's --batch_size for HF; flexlamps' rows")
    ap.add_argument("--gpu-mem", default="64MiB", help="the offloaded flexlamps run's gpu tier")
    ap.add_argument("--cpu-mem", default="256MiB", help="the offloaded flexlamps run's cpu tier (the rest on disk)")
    ap.add_argument("--offload-dir", default=None, help="the offloaded run's disk tier [default: a new temp folder]")
    ap.add_argument("--sides", default="hf,flexlamps,offloaded", help="which of hf, flexlamps, offloaded run")
    ap.add_argument("--responses", type=Path, default=None, help="write each side's responses here (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(REPO / "examples" / "lm_eval"), include_defaults=False)
    sides = make_sides(args)
    responses = {}
    for spec in args.task:
        name, _, limit = spec.partition(":")
        runs = {}
        for side, lm in sides.items():
            runs[side] = evaluate(lm, name, int(limit), manager)
            print(f"{name} {side}: {metrics(runs[side][0])} in {runs[side][1]:.1f} s", flush=True)
        report(name, int(limit), runs, args.threads)
        responses[name] = {side: run[2] for side, run in runs.items()}
    if args.responses:
        args.responses.write_text(json.dumps(responses))


def make_sides(args) -> dict:
    """The lm_eval models compared, by name: lm_eval's HF backend, flexlamps in memory, offloaded."""
    wanted = args.sides.split(",")
    common = dict(dtype="float32", max_length=args.max_length, max_batch_size=args.batch_size, progress=False)
    sides = {}
    if "hf" in wanted:
        sides["hf"] = load_peer(args.model, args.batch_size)[1]
        if args.max_length:
            sides["hf"]._max_length = args.max_length
    if "flexlamps" in wanted:
        sides["flexlamps"] = FlexlampsLM(args.model, **common)
    if "offloaded" in wanted:
        import tempfile

        sides["offloaded"] = FlexlampsLM(args.model, gpu_mem=args.gpu_mem, cpu_mem=args.cpu_mem,
                                         offload_dir=args.offload_dir or tempfile.mkdtemp(prefix="bench_lm_eval_"),
                                         **common)
    return sides


LL_TOLERANCE = 1e-4  # abs, or relative for a long document's sum: float32 in another order differs


def same_responses(a, b) -> bool:
    """Equal responses: texts and greedy flags exactly, log-likelihoods within LL_TOLERANCE."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_responses(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=LL_TOLERANCE, abs_tol=LL_TOLERANCE)
    return a == b


def report(task: str, limit: int, runs: dict, threads: int) -> None:
    import os

    print(f"\n{task}, first {limit} documents, {threads} thread(s), load average {os.getloadavg()[0]:.1f}")
    names = list(runs)
    for n in names[1:]:
        same = sum(same_responses(a, b) for a, b in zip(runs[names[0]][2], runs[n][2]))
        print(f"  {n}: responses equal to {names[0]}'s (log-likelihoods within {LL_TOLERANCE}) on {same} of "
              f"{len(runs[n][2])} documents")
    print("  " + f"{'metric':32s}" + "".join(f"{n:>14s}" for n in names))
    for key in metrics(runs[names[0]][0]):
        print("  " + f"{key:32s}" + "".join(f"{metrics(runs[n][0]).get(key, float('nan')):14.6f}" for n in names))
    print("  " + f"{'wall s':32s}" + "".join(f"{runs[n][1]:14.1f}" for n in names))
    if "hf" in runs:
        for n in names[1:]:
            print(f"  {n}: {runs['hf'][1] / runs[n][1]:.2f}x the HF backend's speed")


if __name__ == "__main__":
    main()
