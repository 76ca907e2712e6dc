"""ESS's table at DeepSeek-V3.2 scale (61 layers, 656 B FP8 latents, 132 B indexer keys,
37 GB/s scattered H2D), with one global pool fraction and with per-layer pools from the LP.

Miss curves come from synthetic selection traces calibrated to ESS's per-layer range (see
placement.latent_traces); step compute through ESS's published points and the DA/DBA overlap
windows as ESS describes them (see placement.ess); every parameter is printed first. Prints,
per context: batch and tokens/s without offload, at ESS's rho, at the best global rho, with
per-layer pools; the gains next to ESS's; bytes moved per step and LRU vs Belady misses.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/sim_ess.py [--steps 24] [--layers 61]
    OMP_NUM_THREADS=1 .venv/bin/python scripts/sim_ess.py --write-curves placement/ess_miss_curves.json
"""

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from placement.ess import (ESS_TABLE, EssDeployment, StepCost, baseline_tokens_per_s, gain, plan_global,
                           plan_global_at, plan_per_layer)
from placement.latent_traces import ess_layer_curves


def report(dep: EssDeployment, cost: StepCost, curves, context: int) -> None:
    row = ESS_TABLE[context]
    base_batch, base_tps = baseline_tokens_per_s(dep, cost, context)
    at_ess = plan_global(dep, cost, curves, context, rho=row["rho"])
    best_global = plan_global(dep, cost, curves, context)
    per_layer = plan_per_layer(dep, cost, curves, context)
    ess_gain = row["ess_tokens_per_s"] / row["base_tokens_per_s"] - 1
    print(f"\n== context {context // 1024}K ==")
    print(f"  no offload: batch {base_batch} (ESS {row['base_batch']}), {base_tps:,.0f} tok/s "
          f"(ESS {row['base_tokens_per_s']:,.0f})")
    for label, plan in ((f"ESS's rho {row['rho']}", at_ess), ("best global rho", best_global),
                        ("per-layer pools (LP)", per_layer)):
        rho = np.mean(plan.pool_entries) / context
        print(f"  {label:22s} batch {plan.batch:4d}, mean pool {rho:.3f}, {plan.tokens_per_s:,.0f} tok/s, "
              f"gain {gain(plan, base_tps):+.1%} (ESS {ess_gain:+.1%}), exposed copy "
              f"{plan.exposed_transfer_s * 1e3:.2f} ms of {plan.compute_s * 1e3:.1f} ms, "
              f"{plan.entries_moved_per_step * dep.latent_bytes / 1e6:.1f} MB moved/step")
    at_ess_batch = plan_global_at(dep, cost, curves, context, row["ess_batch"], row["rho"])
    over = (row["ess_batch"] * (dep.indexer_bytes + row["rho"] * dep.latent_bytes)
            / (dep.cache_budget_bytes / (context * dep.num_layers)) - 1)
    print(f"  (at ESS's own batch {row['ess_batch']} and rho, {over:+.1%} over the cache budget: "
          f"{at_ess_batch.tokens_per_s:,.0f} tok/s, gain {gain(at_ess_batch, base_tps):+.1%}, "
          f"exposed copy {at_ess_batch.exposed_transfer_s * 1e3:.2f} ms)")
    print(f"  per-layer vs best global: {per_layer.tokens_per_s / best_global.tokens_per_s - 1:+.1%} tok/s")
    engine_modes(dep, cost, curves, context, base_tps)
    lru = [c.misses(p) for c, p in zip(curves, at_ess.pool_entries)]
    opt = [c.misses(p, "belady") for c, p in zip(curves, at_ess.pool_entries)]
    print(f"  misses per layer per step at ESS's rho (LRU / Belady lower bound): "
          f"min {min(lru):.1f}/{min(opt):.1f}, mean {np.mean(lru):.1f}/{np.mean(opt):.1f}, "
          f"max {max(lru):.1f}/{max(opt):.1f}; hit rate {1 - np.mean(lru) / dep.topk:.3f} "
          f"(Belady {1 - np.mean(opt) / dep.topk:.3f})")


def engine_modes(dep: EssDeployment, cost: StepCost, curves, context: int, base_tps: float) -> None:
    """flexlamps' two decode modes in these terms, per-layer pools each: exact (the misses'
    copy, then the attention: nothing hidden) and overlapped (the copy under the attention over
    the hits, ESS's DA; the indexer is not split by batch), beside ESS's DA + DBA."""
    modes = {"exact (copy, then attend)": dataclasses.replace(dep, hits_overlap=False),
             "overlapped (copy under the hits' attention)": dataclasses.replace(dep, indexer_overlap=0.0),
             "ESS's DA + DBA": dep}
    for label, mode in modes.items():
        plan = plan_per_layer(mode, cost, curves, context)
        print(f"  engine {label:44s} batch {plan.batch:4d}, {plan.tokens_per_s:,.0f} tok/s, gain "
              f"{gain(plan, base_tps):+.1%}, exposed copy {plan.exposed_transfer_s * 1e3:.2f} ms")


def print_parameters(dep: EssDeployment, cost: StepCost) -> None:
    print("parameters (ESS = arXiv 2512.10576; FlashMLA = its README):")
    print(f"  {dep.num_layers} layers, top-k {dep.topk}, latent {dep.latent_bytes} B + indexer key "
          f"{dep.indexer_bytes} B per token per layer (ESS)")
    print(f"  {dep.num_gpus} GPUs, MTP=2: {dep.queries_per_step} queries per step, {dep.tokens_per_step} tokens "
          f"accepted (ESS); H2D {dep.h2d_bytes_per_s / 1e9:.0f} GB/s scattered (ESS's FlashTrans)")
    print(f"  cache budget {dep.cache_budget_bytes / 1e9:.2f} GB per GPU (ESS's baseline: 52 x 32K fully cached)")
    print(f"  sparse attention {dep.attention_s_per_layer(1) * 1e6:.2f} us per sequence per layer: "
          f"{dep.num_heads} heads x top-k x ({dep.score_dim}+{dep.value_dim}) x 2 FLOP per query at "
          f"{dep.attention_flops_per_s / 1e12:.0f} TFLOP/s (FlashMLA sparse FP8 decode, H800)")
    print(f"  overlap: attention over the hits (ESS's DA) + {dep.indexer_overlap:.0%} of the indexer "
          f"(ESS's DBA splits it by batch)")
    for context, fixed, per_seq in zip(cost.contexts, cost.fixed_s, cost.per_seq_s):
        row = ESS_TABLE[context]
        print(f"  step at {context // 1024}K: {fixed * 1e3:.1f} ms + {per_seq * 1e3:.3f} ms x batch, through "
              f"ESS's ({row['base_batch']}, {dep.step_s(row['base_batch'], row['base_tokens_per_s']) * 1e3:.1f} ms) "
              f"and ({row['ess_batch']}, {dep.step_s(row['ess_batch'], row['ess_tokens_per_s']) * 1e3:.1f} ms "
              "less the copy time exposed there)")
    print(f"  indexer {cost.indexer_s_per_seq_token() * 1e9:.2f} ns per sequence per context token per step "
          f"(the per-sequence step's growth from 32K to 128K)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24, help="decode steps per synthetic trace (8 warm up)")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--write-curves", metavar="PATH", help="only write ESS's per-layer miss curves for the "
                   "planner (placement/ess_miss_curves.json) and stop")
    args = p.parse_args()
    if args.write_curves:
        from placement.latent_traces import ess_miss_curves

        out = Path(args.write_curves)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(ess_miss_curves(args.layers, steps=args.steps).to_json(indent=None) + "\n")
        tmp.replace(out)  # never a half-written curve file
        return
    dep = EssDeployment(num_layers=args.layers)
    start = time.time()
    curves = ess_layer_curves(args.layers, dep.topk, list(ESS_TABLE), steps=args.steps)
    cost = StepCost.fit_ess(dep, curves)
    print_parameters(dep, cost)
    for context in ESS_TABLE:
        report(dep, cost, curves[context], context)
    print(f"\n({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
