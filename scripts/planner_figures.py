"""The planner's figures for every model preset: a plan per preset, machine and workload (tokens/s,
policy, peak bytes per tier), one JSON line each, so that two commits' planners can be compared
line by line (`docs/figures.md`). Pure planning: no weights, a few seconds a plan on one core.

    .venv/bin/python scripts/planner_figures.py [--hardware t4-flexgen,rtx3090] > plans.jsonl
"""

import argparse
import json

import placement
from placement.presets import model_presets

WORKLOADS = ((512, 32), (2048, 128))


def plan_line(model: str, hardware: str, prompt_len: int, gen_len: int) -> dict:
    hw = placement.hardware_preset(hardware)
    line = dict(model=model, hardware=hardware, prompt_len=prompt_len, gen_len=gen_len)
    try:
        plan = placement.solve(placement.model_preset(model), hw,
                               placement.WorkloadSpec(prompt_len=prompt_len, gen_len=gen_len))
    except placement.InfeasiblePlanError as e:
        return dict(line, infeasible=str(e))
    p = plan.policy
    return dict(line, tokens_per_s=round(plan.tokens_per_s, 4), block=[p.gpu_batch_size, p.num_gpu_batches],
                weights=[round(f, 4) for f in p.weights.as_tuple()], cache=[round(f, 4) for f in p.cache.as_tuple()],
                compress=[p.compress_weight, p.compress_cache], cpu_attention=p.cpu_attention,
                peak_gib={tier: round(b / 2**30, 4) for tier, b in plan.peak_bytes.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", default="t4-flexgen,rtx3090", help="hardware presets, comma-separated")
    parser.add_argument("--models", default="", help="model presets, comma-separated (default: all)")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m] or model_presets()
    for model in models:
        for hardware in args.hardware.split(","):
            for prompt_len, gen_len in WORKLOADS:
                print(json.dumps(plan_line(model, hardware, prompt_len, gen_len)), flush=True)


if __name__ == "__main__":
    main()
