"""Zero-shot cloze accuracies of SmolLM2-135M-Instruct against its model card.

The card's setting: lighteval's cloze prompts ('Question: q\\nAnswer:' then ' choice'), accuracy
by log-likelihood per character (acc_norm). Runs are HELM run folders under --output-path, so an
interrupted evaluation resumes. MMLU is the mean over subjects, as lighteval averages it.

    .venv/bin/python scripts/eval_smollm2.py --limit 200 --mmlu-limit 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from flexlamps import LLM, SamplingParams
from flexlamps.evals.helm_env import helm_model_name, write_helm_env
from flexlamps.evals.run_specs import build_run_spec
from flexlamps.evals.runner import execute_run
from flexlamps.evals.scenarios import default_data_dir, load_scenario, mmlu_subjects

CARD = {"arc": 37.3, "piqa": 66.3, "mmlu_cloze": 29.3}  # SmolLM2-135M-Instruct model card


def run(llm, model, name, args, limit, out, suite, batch_size):
    scen = load_scenario(name, dict(args, method="cloze"))
    spec = build_run_spec((name, dict(args, method="cloze")), model, num_shots=0, max_eval_instances=limit)
    t0 = time.perf_counter()
    o = execute_run(llm, spec, scen, out, suite, SamplingParams, batch_size)
    acc = o.stat("mc_accuracy_char_norm")
    print(f"{spec.name:70s} acc_norm={100 * acc:5.1f}  n={o.stat('num_instances'):.0f}  "
          f"{time.perf_counter() - t0:6.1f}s{'  (done before)' if o.skipped else ''}", flush=True)
    return acc, o.stat("num_instances")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=None, help="instances per ARC / PIQA run (default: all)")
    ap.add_argument("--mmlu-limit", type=int, default=None, help="instances per MMLU subject (default: all)")
    ap.add_argument("--mmlu-subjects", default=None, help="comma-separated subjects (default: all 57)")
    ap.add_argument("--output-path", default="benchmark_output")
    ap.add_argument("--suite", default="smollm2_card")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    a = ap.parse_args(argv)

    llm = LLM(a.model, dtype=a.dtype)
    model = helm_model_name(a.model)
    out = Path(a.output_path)
    res = {}
    arc = [run(llm, model, "arc", {"subset": s}, a.limit, out, a.suite, a.batch_size) for s in ("easy", "challenge")]
    res["arc_easy"], res["arc_challenge"] = arc[0][0], arc[1][0]
    res["arc"] = (arc[0][0] + arc[1][0]) / 2
    res["piqa"] = run(llm, model, "piqa", {}, a.limit, out, a.suite, a.batch_size)[0]
    subjects = a.mmlu_subjects.split(",") if a.mmlu_subjects else mmlu_subjects(default_data_dir())
    per = {s: run(llm, model, "mmlu", {"subject": s}, a.mmlu_limit, out, a.suite, a.batch_size)[0] for s in subjects}
    res["mmlu_cloze"] = sum(per.values()) / len(per)
    write_helm_env(out, [model])

    print("\nbenchmark     ours   card   diff")
    for key, card in CARD.items():
        ours = 100 * res[key]
        print(f"{key:12s} {ours:5.1f}  {card:5.1f}  {ours - card:+5.1f}")
    print(f"(ARC-Easy {100 * res['arc_easy']:.1f}, ARC-Challenge {100 * res['arc_challenge']:.1f}; "
          f"limits: {a.limit} per ARC/PIQA run, {a.mmlu_limit} per MMLU subject, {len(subjects)} subjects)")
    if a.json:
        Path(a.json).write_text(json.dumps({"ours": res, "card": CARD, "mmlu_subjects": per, "limit": a.limit,
                                            "mmlu_limit": a.mmlu_limit}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
