"""Placement planner benchmark: search time for OPT-175B on FlexGen's T4 box, and the
predicted throughput against FlexGen's measured numbers (ratios, one run).

    .venv/bin/python scripts/bench_plan.py [--repeats 5]
"""

import argparse
import statistics
import time

from placement import Policy, TierSplit, WorkloadSpec, hardware_preset, model_preset, predict, solve

ON_CPU = TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
# FlexGen's benchmark suite on its T4 box, prompt 512 / output 32: hand-set policies and
# the measured tok/s from its paper
FLEXGEN_POLICIES = (
    ("opt-6.7b", Policy(gpu_batch_size=2, num_gpu_batches=1, weights=ON_GPU, cache=ON_GPU,
                        activations=ON_GPU), 25.26),
    ("opt-30b", Policy(gpu_batch_size=48, num_gpu_batches=3,
                       weights=TierSplit(gpu=0.2, cpu=0.8, disk=0.0), cache=ON_CPU,
                       activations=ON_CPU, cpu_attention=True), 7.32),
    ("opt-175b", Policy(gpu_batch_size=32, num_gpu_batches=8,
                        weights=TierSplit(gpu=0.0, cpu=0.5, disk=0.5),
                        cache=TierSplit(gpu=0.0, cpu=0.0, disk=1.0), activations=ON_CPU,
                        cpu_attention=True), 0.69),
    ("opt-6.7b", Policy(gpu_batch_size=72, num_gpu_batches=1, weights=ON_GPU, cache=ON_GPU,
                        activations=ON_GPU, compress_weight=True, compress_cache=True), 29.12),
    ("opt-30b", Policy(gpu_batch_size=64, num_gpu_batches=8, weights=ON_CPU, cache=ON_CPU,
                       activations=ON_CPU, compress_cache=True), 8.38),
    ("opt-175b", Policy(gpu_batch_size=48, num_gpu_batches=3, weights=ON_CPU, cache=ON_CPU,
                        activations=ON_CPU, compress_weight=True, compress_cache=True), 1.12),
)

FLEXGEN_MEASURED = (("opt-6.7b", False, 25.26), ("opt-30b", False, 7.32), ("opt-175b", False, 0.69),
                    ("opt-6.7b", True, 29.12), ("opt-30b", True, 8.38), ("opt-175b", True, 1.12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    hw, workload = hardware_preset("t4-flexgen"), WorkloadSpec(prompt_len=512, gen_len=32)

    opt175b = model_preset("opt-175b")
    times, plan = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        plan = solve(opt175b, hw, workload)
        times.append(time.perf_counter() - start)
    print(f"OPT-175B full search on t4-flexgen: median {statistics.median(times):.3f} s, "
          f"max {max(times):.3f} s over {args.repeats} runs ({plan.num_lps_solved} LPs); "
          f"ratio to the 2 s target {statistics.median(times) / 2.0:.2f}")
    print(f"  compressed plan: {plan.summary()}")

    print("FlexGen's measured runs (T4, prompt 512, output 32) vs the solver's own plan:")
    for name, compress, measured in FLEXGEN_MEASURED:
        own = solve(model_preset(name), hw, workload, allow_weight_compression=compress,
                    allow_cache_compression=compress)
        print(f"  {name:9} compression {'on ' if compress else 'off'}  measured {measured:6.2f}  "
              f"planned {own.tokens_per_s:6.2f}  ratio {own.tokens_per_s / measured:.2f}")
    print("FlexGen's exact published policies, predicted vs measured:")
    for name, policy, measured in FLEXGEN_POLICIES:
        predicted = predict(policy, model_preset(name), hw, workload).tokens_per_s
        print(f"  {name:9} block {policy.gpu_batch_size}x{policy.num_gpu_batches:<2} "
              f"compress w{policy.compress_weight:d} c{policy.compress_cache:d}  "
              f"measured {measured:6.2f}  predicted {predicted:6.2f}  ratio {predicted / measured:.2f}")
    solved = solve(model_preset("opt-30b"), hw, workload, allow_weight_compression=False,
                   allow_cache_compression=False)
    print(f"OPT-30B solver's own uncompressed plan: {solved.tokens_per_s:.2f} tok/s, "
          f"ratio to FlexGen's measured 7.32: {solved.tokens_per_s / 7.32:.3f}")


if __name__ == "__main__":
    main()
