"""Paper comparison in the simulator: LAMPS vs INFERCEPT vs vLLM-FCFS (and SJF) on the
INFERCEPT traces, GPT-J-6B on A100-40GB cost model. Prints ratios measured in this run.

Checks (issue 7): at a load where INFERCEPT's mean TTFT >= 2x its low-load TTFT, LAMPS's mean
E2E <= 0.73x INFERCEPT's and <= FCFS's, and mean TTFT <= 0.96x INFERCEPT's; at the lowest load
no regression over 5%; with multiplicative Gaussian noise (sigma 0.6) on every prediction,
LAMPS's mean E2E <= INFERCEPT's (noise-free INFERCEPT, the stricter comparison).

    .venv/bin/python scripts/bench_sched.py [--window 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from flexlamps.sched.cost_model import CostModel  # noqa: E402
from flexlamps.sim.run import run_policy  # noqa: E402
from flexlamps.sim.trace import load_templates, replay  # noqa: E402

DATA = os.path.join(REPO, "..", "shared", "data", "augmented")
TRACES = {
    "multi-API": ("merged_exp_uniform.json", [1, 4, 6, 8]),
    "single-API": ("diverse_oneapi_merged_exp_uniform.json", [1, 8, 12, 16]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0, help="replay window (s): 4 x qps x window requests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise-sigma", type=float, default=0.6)
    ap.add_argument("--predictor", default="oracle", choices=["oracle", "learned"])
    ap.add_argument("--speed", action="store_true", help="also time 10k-request simulations")
    args = ap.parse_args()
    cost = CostModel.gptj6b_a100()
    print(f"cost model: {cost.note}; gpu KV {cost.gpu_kv_tokens} tokens, cpu swap {cost.cpu_swap_tokens} tokens")
    ok_all = True
    t_start = time.perf_counter()
    for label, (fname, loads) in TRACES.items():
        path = os.path.join(DATA, fname)
        if not os.path.exists(path):
            print(f"{label}: {path} missing, skipped")
            continue
        templates = load_templates(path, max_model_len=cost.max_model_len)
        print(f"\n== {label} ({fname}), window {args.window:g} s, predictor {args.predictor} ==")
        print(f"{'qps':>4s} {'n':>6s} | {'E2E: lamps':>10s} {'infercept':>9s} {'fcfs':>8s} {'sjf':>8s} | "
              f"{'TTFT: lamps':>11s} {'infercept':>9s} {'fcfs':>8s} | {'E2E L/I':>7s} {'L/F':>5s} "
              f"{'TTFT L/I':>8s} | {'noisy L/I':>9s} | loaded pass")
        low_ttft, passed_loaded = None, False
        for qps in loads:
            specs = replay(templates, qps, args.window, args.seed)
            s = {p: run_policy(specs, p, qps, cost, args.predictor, seed=args.seed).summary
                 for p in ("lamps", "infercept", "fcfs", "sjf")}
            noisy = run_policy(specs, "lamps", qps, cost, args.predictor, args.noise_sigma, args.seed).summary
            li, lf = s["lamps"].e2e_mean / s["infercept"].e2e_mean, s["lamps"].e2e_mean / s["fcfs"].e2e_mean
            ti = s["lamps"].ttft_mean / s["infercept"].ttft_mean
            ni = noisy.e2e_mean / s["infercept"].e2e_mean
            if low_ttft is None:
                low_ttft = s["infercept"].ttft_mean
                lowest_ok = li <= 1.05 and ti <= 1.05
                verdict = f"lowest load: {'ok' if lowest_ok else 'REGRESSION'}"
                ok_all &= lowest_ok
            else:
                loaded = s["infercept"].ttft_mean >= 2 * low_ttft
                good = li <= 0.73 and lf <= 1.0 and ti <= 0.96 and ni <= 1.0
                passed_loaded |= loaded and good
                verdict = f"{'yes' if loaded else 'no ':3s}  {'PASS' if good else 'fail'}"
            ok_all &= ni <= 1.0
            print(f"{qps:4g} {len(specs):6d} | {s['lamps'].e2e_mean:10.2f} {s['infercept'].e2e_mean:9.2f} "
                  f"{s['fcfs'].e2e_mean:8.2f} {s['sjf'].e2e_mean:8.2f} | {s['lamps'].ttft_mean:11.3f} "
                  f"{s['infercept'].ttft_mean:9.3f} {s['fcfs'].ttft_mean:8.3f} | {li:7.3f} {lf:5.3f} "
                  f"{ti:8.3f} | {ni:9.3f} | {verdict}", flush=True)
        ok_all &= passed_loaded
        print(f"{label}: {'a loaded point meets every ratio' if passed_loaded else 'NO loaded point meets the ratios'}")
    if args.speed:
        templates = load_templates(os.path.join(DATA, TRACES["multi-API"][0]), max_model_len=cost.max_model_len)
        for qps in (2.0, 4.0):
            specs = replay(templates, qps, num_requests=10_000, seed=args.seed)
            for policy in ("infercept", "lamps"):
                cpu = time.process_time()
                res = run_policy(specs, policy, qps, cost, args.predictor, seed=args.seed)
                cpu = time.process_time() - cpu
                st = res.simulator.stats
                print(f"speed: {len(specs)} requests, qps {qps:g}, {policy}: {cpu:.1f} s cpu "
                      f"({res.summary.sim_seconds:.1f} s wall), {st.iterations} iterations in "
                      f"{st.schedule_calls} scheduler calls")
    print(f"\nall checks {'passed' if ok_all else 'FAILED'} ({time.perf_counter() - t_start:.0f} s)")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
