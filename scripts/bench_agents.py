"""Real engine vs simulator on augmented requests: SmolLM2 on this CPU, the INFERCEPT trace
scaled down, LAMPS / INFERCEPT / FCFS. Prints each policy's mean E2E and TTFT measured on the
engine, the ratios the issue asks about (LAMPS/INFERCEPT, INFERCEPT/FCFS), what the simulator
predicts for the same requests with the cost model measured here, and whether the two order
the policies alike.

Sized to finish within 10 minutes on a 2-core machine shared with other jobs: 6 requests of a
shortened trace (prompts <= 64, segments <= 16 tokens, contexts <= 192), API times scaled by
0.1, on the CPU clock (this process's CPU seconds, API waits skipped, so other jobs cannot
stretch the figures); the built-in 135M model.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_agents.py [--num-requests 6 --qps 0.5]
"""

import argparse
import os
import time

from flexlamps.api import LLM
from flexlamps.engine.augmented.engine import CpuClock, WallClock
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import AgentsConfig, measure_cost, run_policy_on_engine
from flexlamps.sched.scheduler import SchedulerConfig
from flexlamps.sim.metrics import summarize
from flexlamps.sim.run import run_policy
from flexlamps.workloads.tokenized import TraceScale, load_trace, replay_requests

POLICIES = ("lamps", "infercept", "fcfs")
TRACE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                     "data", "augmented", "merged_exp_uniform.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--num-requests", type=int, default=6)
    p.add_argument("--qps", type=float, default=0.5)
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--max-context", type=int, default=192)
    p.add_argument("--max-prompt", type=int, default=64)
    p.add_argument("--max-output", type=int, default=16)
    p.add_argument("--max-api-tokens", type=int, default=24)
    p.add_argument("--gpu-kv-mib", type=float, default=24)
    p.add_argument("--cpu-swap-mib", type=float, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                   help="cpu: this process's CPU time with API waits skipped (stable on a shared box)")
    p.add_argument("--verify", action="store_true", help="also check outputs against uninterrupted generation")
    a = p.parse_args()

    t_start = time.perf_counter()
    llm = LLM(a.model)
    scale = TraceScale(time_scale=a.time_scale, max_prompt=a.max_prompt, max_segment_output=a.max_output,
                       max_api_tokens=a.max_api_tokens, max_context=a.max_context)
    config = AgentsConfig(gpu_kv_bytes=int(a.gpu_kv_mib * 2**20), cpu_swap_bytes=int(a.cpu_swap_mib * 2**20))
    requests = replay_requests(llm.config, load_trace(llm.tokenizer, a.trace), scale, a.qps, a.num_requests, a.seed)
    cost = measure_cost(llm.executor, config, a.max_context, cpu_clock=a.clock == "cpu")
    print(f"{len(requests)} requests, {sum(r.spec.output_tokens for r in requests)} output tokens, "
          f"{sum(len(r.spec.segments) - 1 for r in requests)} calls; gpu pool {cost.gpu_kv_tokens} tokens, "
          f"cpu swap {cost.cpu_swap_tokens}; measured decode step {cost.compute_time(0, 1, 0):.3f} s, "
          f"prefill {cost.prefill_per_token_s * 1e3:.2f} ms/token")
    expected = uninterrupted_tokens(llm.executor, requests) if a.verify else None
    sched_cfg = SchedulerConfig(cost.gpu_kv_tokens // config.block_size, cost.cpu_swap_tokens // config.block_size,
                                config.block_size, max_num_seqs=config.max_num_seqs,
                                max_num_batched_tokens=config.max_num_batched_tokens)
    real, sim = {}, {}
    print(f"{'policy':10s} {'E2E mean':>9s} {'TTFT mean':>9s} {'norm s/tok':>10s} {'recompute':>9s} "
          f"{'P/S/D':>9s} {'sim E2E':>8s} {'wall s':>7s} exact")
    for policy in POLICIES:
        t0 = time.perf_counter()
        res = run_policy_on_engine(llm.executor, requests, policy, config, cost,
                                   clock=CpuClock() if a.clock == "cpu" else WallClock())
        real[policy] = summarize(res.records, policy, a.qps, res.end_time)
        sim[policy] = run_policy([r.spec for r in requests], policy, a.qps, cost, config=sched_cfg).summary
        exact = "-" if expected is None else all(res.tokens[k] == v for k, v in expected.items())
        st = res.stats.strategies
        print(f"{policy:10s} {real[policy].e2e_mean:9.2f} {real[policy].ttft_mean:9.2f} "
              f"{real[policy].norm_mean:10.3f} {res.stats.recompute_tokens:9d} "
              f"{st['preserve']:>3d}/{st['swap']}/{st['discard']:<3d} {sim[policy].e2e_mean:8.2f} "
              f"{time.perf_counter() - t0:7.0f} {exact}")
    for name, s in (("real", real), ("sim", sim)):
        print(f"{name}: mean E2E LAMPS/INFERCEPT {s['lamps'].e2e_mean / s['infercept'].e2e_mean:.2f}, "
              f"INFERCEPT/FCFS {s['infercept'].e2e_mean / s['fcfs'].e2e_mean:.2f}; mean TTFT LAMPS/INFERCEPT "
              f"{s['lamps'].ttft_mean / s['infercept'].ttft_mean:.2f}")
    order = {name: sorted(POLICIES, key=lambda q: s[q].e2e_mean) for name, s in (("real", real), ("sim", sim))}
    print(f"ordering by mean E2E: real {' < '.join(order['real'])}; sim {' < '.join(order['sim'])}: "
          f"{'match' if order['real'] == order['sim'] else 'DIFFER'} ({time.perf_counter() - t_start:.0f} s wall, "
          f"{time.process_time():.0f} s cpu in all)")


if __name__ == "__main__":
    main()
