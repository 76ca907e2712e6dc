"""Shared-prefix reuse on a 5-shot MMLU run: prefill tokens computed and wall time, reuse on vs off.

Both runs go through the same `flexlamps helm` pipeline (5 in-context examples, each question's
choices scored as continuations), one after the other in this process; the ratios printed are
measured in this one run.

    .venv/bin/python scripts/eval_prefix_reuse.py --subject anatomy --limit 100
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from flexlamps import LLM, SamplingParams
from flexlamps.evals.helm_env import helm_model_name
from flexlamps.evals.run_specs import build_run_spec
from flexlamps.evals.runner import execute_run
from flexlamps.evals.scenarios import load_scenario


def measure(model: str, reuse: bool, subject: str, method: str, limit: int, shots: int, batch_size: int, out: Path):
    llm = LLM(model, reuse_prefix=reuse)
    args = {"subject": subject, "method": method}
    spec = build_run_spec(("mmlu", args), helm_model_name(model), num_shots=shots, max_eval_instances=limit)
    o = execute_run(llm, spec, load_scenario("mmlu", args), out / ("on" if reuse else "off"), "reuse",
                    SamplingParams, batch_size, overwrite=True)
    return {k: o.engine[k] for k in ("run_wall_time", "prefill_tokens_requested", "prefill_tokens_computed")} | {
        "accuracy": o.stat(spec.main_metric), "num_instances": o.stat("num_instances"), "run": spec.name}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--subject", default="anatomy")
    ap.add_argument("--method", default="cloze", choices=["cloze", "separate"],
                    help="log-likelihood scoring, where the engine counts prefill tokens")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        on = measure(a.model, True, a.subject, a.method, a.limit, a.shots, a.batch_size, Path(tmp))
        off = measure(a.model, False, a.subject, a.method, a.limit, a.shots, a.batch_size, Path(tmp))
    for name, r in (("reuse on", on), ("reuse off", off)):
        print(f"{name:10s} wall {r['run_wall_time']:7.1f}s  prefill requested {r['prefill_tokens_requested']:9.0f}"
              f"  computed {r['prefill_tokens_computed']:9.0f}  accuracy {r['accuracy']:.3f}  n={r['num_instances']:.0f}")
    tok_ratio = off["prefill_tokens_computed"] / on["prefill_tokens_computed"]
    wall_ratio = off["run_wall_time"] / on["run_wall_time"]
    print(f"prefill tokens computed: {tok_ratio:.2f}x fewer with reuse; wall time: {wall_ratio:.2f}x faster")
    same = on["accuracy"] == off["accuracy"]
    print(f"accuracy identical with and without reuse: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps({"on": on, "off": off, "prefill_ratio": tok_ratio,
                                            "wall_ratio": wall_ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
