"""`flexlamps simulate`: replay an augmented-request trace through the scheduling policies."""

from __future__ import annotations

import json
import os
import tempfile

import click


def _floats(ctx, param, value):
    try:
        out = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}")
    if not out or any(v <= 0 for v in out):
        raise click.BadParameter(f"expected positive loads, got {value!r}")
    return out


def _policies(ctx, param, value):
    from flexlamps.sched.policies import POLICIES

    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise click.BadParameter(f"unknown policy {unknown}; choose from {', '.join(POLICIES)}")
    return names


def _write_json(path: str, obj) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


@click.command("simulate")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False),
              help="INFERCEPT-format trace, e.g. ../shared/data/augmented/merged_exp_uniform.json")
@click.option("--policies", default="lamps,infercept,fcfs,sjf", callback=_policies, show_default=True,
              help="comma-separated: fcfs, infercept, sjf, lamps, mlfq, vtc")
@click.option("--qps", default="1,2,4", callback=_floats, show_default=True,
              help="comma-separated arrival rates (requests/s)")
@click.option("--window", default=600.0, show_default=True,
              help="replay window in seconds: 4 x qps x window requests (the papers use 1800)")
@click.option("--seed", default=0, show_default=True)
@click.option("--predictor", type=click.Choice(["oracle", "learned"]), default="oracle", show_default=True)
@click.option("--noise-sigma", default=0.0, show_default=True,
              help="multiplicative Gaussian noise on predictions (LAMPS's robustness study: 0.6)")
@click.option("--cost-model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CostModel JSON (default: GPT-J-6B on A100-40GB, derived from datasheets)")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="folder for summary.json and the PNG plots")
@click.option("--no-plots", is_flag=True, help="skip the matplotlib plots")
def command(trace_path, policies, qps, window, seed, predictor, noise_sigma, cost_model, out_dir, no_plots):
    """Simulate augmented requests (API-call pauses) under each policy and load."""
    from tqdm import tqdm

    from flexlamps.sched.cost_model import CostModel
    from flexlamps.sim.run import run_policy
    from flexlamps.sim.trace import load_templates, replay

    try:
        cost = CostModel.load(cost_model) if cost_model else CostModel.gptj6b_a100()
        templates = load_templates(trace_path, max_model_len=cost.max_model_len)
    except ValueError as e:
        raise click.ClickException(str(e))
    os.makedirs(out_dir, exist_ok=True)
    summaries, cdfs = [], {}
    header = f"{'policy':10s} {'qps':>5s} {'n':>6s} {'E2E mean':>9s} {'p50':>8s} {'p99':>8s} " \
             f"{'TTFT mean':>9s} {'p50':>7s} {'p99':>7s} {'norm mean':>9s} {'p50':>7s} {'p99':>7s} " \
             f"{'req/s':>6s} {'tok/s':>7s}"
    rows = []
    with tqdm(total=len(qps) * len(policies), desc="simulating", unit="run", leave=False) as bar:
        for load in qps:
            specs = replay(templates, load, window, seed)
            for policy in policies:
                res = run_policy(specs, policy, load, cost, predictor, noise_sigma, seed)
                s = res.summary
                summaries.append(s)
                cdfs.setdefault(load, {})[policy] = [r.e2e for r in res.records]
                rows.append(f"{s.policy:10s} {s.qps:5g} {s.num_requests:6d} {s.e2e_mean:9.2f} {s.e2e_p50:8.2f} "
                            f"{s.e2e_p99:8.2f} {s.ttft_mean:9.3f} {s.ttft_p50:7.3f} {s.ttft_p99:7.2f} "
                            f"{s.norm_mean:9.4f} {s.norm_p50:7.4f} {s.norm_p99:7.3f} "
                            f"{s.throughput_rps:6.2f} {s.throughput_tps:7.0f}")
                bar.update()
    click.echo(f"cost model: {cost.note or 'custom'}; gpu KV {cost.gpu_kv_tokens} tokens, "
               f"cpu swap {cost.cpu_swap_tokens} tokens; latency in s, normalized = "
               "(E2E - API time) / output tokens")
    click.echo(header)
    for row in rows:
        click.echo(row)
    _write_json(os.path.join(out_dir, "summary.json"), {
        "trace": os.path.abspath(trace_path), "window": window, "seed": seed, "predictor": predictor,
        "noise_sigma": noise_sigma, "cost_model": cost.to_json(),
        "results": [s.to_json() for s in summaries],
    })
    if not no_plots:
        from flexlamps.sim.plots import plot_cdf, plot_vs_load

        name = os.path.basename(trace_path)
        for load, by_policy in cdfs.items():
            plot_cdf(by_policy, f"E2E CDF, {name}, qps {load:g}", os.path.join(out_dir, f"cdf_qps{load:g}.png"))
        plot_vs_load(summaries, os.path.join(out_dir, "latency_vs_load.png"), name)
    click.echo(f"wrote {out_dir}/summary.json" + ("" if no_plots else " and PNG plots"))
