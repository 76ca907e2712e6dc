"""The papers' comparison in the simulator, in steady state: INFERCEPT vs LAMPS vs ours
(lamps-ts) vs vLLM-FCFS on the two INFERCEPT traces, under the papers' setting (the
infercept-gptj6b preset: INFERCEPT's GPT-J-6B A100 profile, 384-token budget, 128 GiB swap).

For each trace it finds each policy's saturation load (the highest load passing the window
test, grid then bisection; see flexlamps.sim.steady), then compares the policies at 50%, 80%
and 95% of INFERCEPT's saturation load: LAMPS / INFERCEPT and ours / INFERCEPT, mean and P99
E2E, with the window test of every point. Ours is also run with noisy predictions (sigma 0.6)
and with the learned predictor, against noise-free INFERCEPT (the stricter test). Checks (the
issue's acceptance): ours' mean E2E <= LAMPS's (same predictions) and P99 <= 1.05x
INFERCEPT's at every point.

    .venv/bin/python scripts/bench_sched.py [--window 150] [--seed 0] [--traces multi-API,single-API]
        [--data ../shared/data/augmented]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from flexlamps.sched.cost_model import PAPER_SETTING, CostModel  # noqa: E402
from flexlamps.sched.scheduler import SchedulerConfig  # noqa: E402
from flexlamps.sim.sweep import Setting, measure, saturation  # noqa: E402
from flexlamps.workloads.trace import load_templates  # noqa: E402

DATA = os.path.join(REPO, "..", "shared", "data", "augmented")
TRACES = {  # label -> (file, load grid for the saturation search)
    "multi-API": ("merged_exp_uniform.json", [2, 4, 5, 6, 8]),
    "single-API": ("diverse_oneapi_merged_exp_uniform.json", [4, 8, 12, 16]),
}
SATURATION_POLICIES = ("infercept", "lamps", "lamps-ts", "fcfs")
FRACTIONS = (0.5, 0.8, 0.95)
# variant label -> (policy, predictor, noise sigma)
VARIANTS = {
    "lamps": ("lamps", "oracle", 0.0),
    "ours": ("lamps-ts", "oracle", 0.0),
    "lamps s0.6": ("lamps", "oracle", 0.6),
    "ours s0.6": ("lamps-ts", "oracle", 0.6),
    "lamps learned": ("lamps", "learned", 0.0),
    "ours learned": ("lamps-ts", "learned", 0.0),
}
# ours vs LAMPS with the same predictions
PAIRS = (("ours", "lamps"), ("ours s0.6", "lamps s0.6"), ("ours learned", "lamps learned"))


def _setting(base: Setting, predictor: str, sigma: float) -> Setting:
    return Setting(base.cost, base.config, base.window, base.seed, predictor, sigma)


def _flag(st) -> str:
    return "s" if st.stable else "U"


def bench_trace(label: str, templates, base: Setting, fractions) -> bool:
    print(f"\n== {label}: saturation (highest load passing the window test) ==", flush=True)
    sat = {}
    for policy in SATURATION_POLICIES:
        t0 = time.perf_counter()
        sat[policy], pts = saturation(templates, policy, TRACES[label][1], base)
        tried = ", ".join(f"{q:g}{_flag(p)}" for q, p in sorted(pts.items()))
        print(f"{policy:10s} saturates above {sat[policy]} req/s  (tried {tried}; "
              f"{time.perf_counter() - t0:.0f} s)", flush=True)
    if not sat["infercept"]:
        print(f"{label}: INFERCEPT unstable at the lowest load; no comparison")
        return False
    print(f"\n== {label}: ratios to INFERCEPT (mean / P99 E2E), window test s = stable, U = not ==")
    print(f"{'load':>12s} {'INFERCEPT mean':>14s} {'p99':>6s} | " +
          " | ".join(f"{v:>17s}" for v in VARIANTS), flush=True)
    ok = True
    for frac in fractions:
        qps = round(frac * sat["infercept"], 3)
        inf = measure(templates, "infercept", qps, base)
        cells, got = [], {}
        for name, (policy, predictor, sigma) in VARIANTS.items():
            st = got[name] = measure(templates, policy, qps, _setting(base, predictor, sigma))
            m = st.summary.e2e_mean / inf.summary.e2e_mean
            p = st.summary.e2e_p99 / inf.summary.e2e_p99
            cells.append(f"{m:5.3f} / {p:5.3f} {_flag(st)}")
        print(f"{frac:4.0%} {qps:6.3g}/s {inf.summary.e2e_mean:14.2f} {inf.summary.e2e_p99:6.1f} "
              f"{_flag(inf)} | " + " | ".join(f"{c:>17s}" for c in cells), flush=True)
        for ours, lamps in PAIRS:
            s = got[ours].summary
            ok &= s.e2e_p99 <= 1.05 * inf.summary.e2e_p99 and s.e2e_mean <= got[lamps].summary.e2e_mean
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=150.0,
                    help="replay window (s): 4 x qps x window requests over 4 x window s")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=DATA, help="folder holding the INFERCEPT traces")
    ap.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, from {', '.join(TRACES)}")
    args = ap.parse_args()
    labels = args.traces.split(",")
    if set(labels) - set(TRACES):
        ap.error(f"unknown traces {sorted(set(labels) - set(TRACES))}; choose from {', '.join(TRACES)}")
    cost = CostModel.infercept_gptj6b()
    config = SchedulerConfig.from_cost_model(cost, **PAPER_SETTING)
    base = Setting(cost, config, args.window, args.seed)
    print(f"cost model: {cost.note}; gpu KV {cost.gpu_kv_tokens} tokens, cpu swap {cost.cpu_swap_tokens}; "
          f"budget {config.max_num_batched_tokens}; window {args.window:g} s, seed {args.seed}")
    t0 = time.perf_counter()
    ok = True
    for label in labels:
        path = os.path.join(args.data, TRACES[label][0])
        if not os.path.exists(path):
            print(f"{label}: {path} missing, skipped")
            continue
        ok &= bench_trace(label, load_templates(path, max_model_len=cost.max_model_len), base, FRACTIONS)
    print(f"\nours: mean <= LAMPS (same predictions) and P99 <= 1.05x INFERCEPT at every point: {'yes' if ok else 'NO'} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
