"""`flexlamps simulate`: replay an augmented-request trace through the scheduling policies."""

from __future__ import annotations

import json
import os

import click

from flexlamps.commands.options import plots_wanted, writable_folder
from flexlamps.io.atomic import atomic_output
from flexlamps.sched.cost_model import CostModel, PAPER_SETTING
from flexlamps.sched.policies import POLICIES
from flexlamps.sched.scheduler import SchedulerConfig
from flexlamps.sim.plots import plot_vs_load
from flexlamps.sim.sweep import Setting, measure, saturation
from flexlamps.workloads.trace import load_templates


def _floats(ctx, param, value):
    try:
        out = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}")
    if not out or any(v <= 0 for v in out):
        raise click.BadParameter(f"expected positive loads, got {value!r}")
    return out


def _policies(ctx, param, value):
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise click.BadParameter(f"unknown policy {unknown}; choose from {', '.join(POLICIES)}")
    return names


def _write_json(path: str, obj) -> None:
    with atomic_output(path) as f:
        json.dump(obj, f, indent=2)


def _setting(preset, token_budget, max_seqs, swap_gib, cost_model, window, seed, predictor,
             noise_sigma, warmup, cooldown, starvation_threshold, horizon, policies):
    paper = preset == "infercept-gptj6b"
    kw = {} if swap_gib is None else {"cpu_swap_gib": swap_gib}
    cost = CostModel.load(cost_model) if cost_model else CostModel.preset(preset, **kw)
    if cost_model and swap_gib is not None:
        cost.cpu_swap_tokens = int(swap_gib * 2**30 // cost.kv_bytes_per_token)
    budget = token_budget or (PAPER_SETTING["max_num_batched_tokens"] if paper else 2048)
    config = SchedulerConfig.from_cost_model(cost, max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    lamps_kw = {"starvation_threshold": starvation_threshold or None, "horizon": horizon}
    policy_kwargs = {p: lamps_kw for p in policies if p.startswith("lamps")}
    return Setting(cost, config, window, seed, predictor, noise_sigma, warmup, cooldown, policy_kwargs)


HEADER = (f"{'policy':10s} {'qps':>6s} {'n':>5s} {'E2E mean':>9s} {'p50':>7s} {'p99':>7s} "
          f"{'TTFT mean':>9s} {'p99':>7s} {'norm mean':>9s} {'offered':>7s} {'achieved':>8s} "
          f"{'growth':>6s} window")


def _row(st) -> str:
    s = st.summary
    return (f"{s.policy:10s} {s.qps:6g} {st.measured:5d} {s.e2e_mean:9.2f} {s.e2e_p50:7.2f} "
            f"{s.e2e_p99:7.1f} {s.ttft_mean:9.3f} {s.ttft_p99:7.2f} {s.norm_mean:9.4f} "
            f"{st.offered_rps:7.2f} {st.achieved_rps:8.2f} {st.growth:6.2f} "
            f"{'stable' if st.stable else 'UNSTABLE'}")


@click.command("simulate")
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False),
              help="INFERCEPT-format trace, e.g. ../shared/data/augmented/merged_exp_uniform.json")
@click.option("--schedulers", "--policies", "policies", default="lamps,infercept,fcfs,sjf", callback=_policies,
              show_default=True,
              help="scheduling policies, comma-separated, from: fcfs, infercept, infercept-at-call, sjf, lamps, "
                   "lamps-ts, mlfq, vtc (--policies: the same)")
@click.option("--qps", default="1,2,4", callback=_floats, show_default=True,
              help="comma-separated arrival rates (requests/s); with --sweep, the grid to search")
@click.option("--window", default=300.0, type=click.FloatRange(min=0, min_open=True), show_default=True,
              help="replay window in seconds: 4 x qps x window requests (the papers use 1800)")
@click.option("--seed", default=0, show_default=True)
@click.option("--predictor", type=click.Choice(["oracle", "learned"]), default="oracle", show_default=True)
@click.option("--noise-sigma", default=0.0, type=click.FloatRange(min=0), show_default=True,
              help="multiplicative Gaussian noise on predictions (LAMPS's robustness study: 0.6)")
@click.option("--preset", type=click.Choice(["infercept-gptj6b", "gptj6b-a100-datasheet"]),
              default="infercept-gptj6b", show_default=True,
              help="infercept-gptj6b: the papers' setting (INFERCEPT's GPT-J-6B A100 profile, 384-token "
                   "budget, 128 GiB swap); gptj6b-a100-datasheet: derived from shapes and datasheets "
                   "(2048-token budget, 4 GiB swap)")
@click.option("--cost-model", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CostModel JSON (replaces the preset's cost model)")
@click.option("--token-budget", type=click.IntRange(min=16), default=None,
              help="tokens per iteration [default: 384 with infercept-gptj6b, else 2048]")
@click.option("--max-seqs", default=256, type=click.IntRange(min=1), show_default=True, help="sequences per iteration")
@click.option("--swap-gib", type=click.FloatRange(min=0), default=None, help="cpu swap space in GiB [default: the preset's]")
@click.option("--starvation-threshold", default=100, type=click.IntRange(min=0), show_default=True,
              help="LAMPS: iterations waiting before a request goes first (0: no guard)")
@click.option("--horizon", type=click.Choice(["segment", "request"]), default="segment", show_default=True,
              help="LAMPS: rank by memory until the next call returns, or over the whole request")
@click.option("--warmup", default=0.15, type=click.FloatRange(0, 1, max_open=True), show_default=True, help="fraction of the arrival span excluded at the start")
@click.option("--cooldown", default=0.15, type=click.FloatRange(0, 1, max_open=True), show_default=True, help="fraction of the arrival span excluded at the end")
@click.option("--sweep", is_flag=True,
              help="find each policy's saturation load (window test) on the --qps grid, bisected, and "
                   "draw latency-vs-load curves marking it")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="folder for summary.json and the PNG plots")
@click.option("--no-plots", is_flag=True, help="skip the matplotlib plots")
def command(trace_path, policies, qps, window, seed, predictor, noise_sigma, preset, cost_model,
            token_budget, max_seqs, swap_gib, starvation_threshold, horizon, warmup, cooldown,
            sweep, out_dir, no_plots):
    """Simulate augmented requests (API-call pauses) under each policy and load, measured in
    steady state: warm-up and cool-down excluded, throughput without the drain, and a window
    test per point (does latency grow with the time the system has run?)."""
    if warmup + cooldown >= 1:
        raise click.UsageError(f"--warmup {warmup} and --cooldown {cooldown} leave no arrivals to measure; keep "
                               "their sum below 1")
    writable_folder(out_dir, "--out")
    no_plots = not plots_wanted(no_plots)
    try:
        setting = _setting(preset, token_budget, max_seqs, swap_gib, cost_model, window, seed,
                           predictor, noise_sigma, warmup, cooldown, starvation_threshold, horizon,
                           policies)
        templates = load_templates(trace_path, max_model_len=setting.cost.max_model_len)
    except ValueError as e:
        raise click.ClickException(str(e))
    cost, config = setting.cost, setting.config
    click.echo(f"cost model: {cost.note or 'custom'}; gpu KV {cost.gpu_kv_tokens} tokens, cpu swap "
               f"{cost.cpu_swap_tokens} tokens; budget {config.max_num_batched_tokens} tokens, "
               f"{config.max_num_seqs} seqs; measured span: arrivals after the first {warmup:.0%} "
               f"and before the last {cooldown:.0%}; latency in s")
    click.echo(HEADER)
    points, sat = [], {}
    try:
        for policy in policies:
            if sweep:
                sat[policy], got = saturation(templates, policy, qps, setting,
                                              on_point=lambda st: click.echo(_row(st)))
                points.extend(got.values())
                click.echo(f"{policy}: saturates above {sat[policy]} req/s" if sat[policy]
                           else f"{policy}: unstable at the lowest load {min(qps):g}")
            else:
                for load in qps:
                    points.append(measure(templates, policy, load, setting))
                    click.echo(_row(points[-1]))
    except ValueError as e:
        raise click.ClickException(str(e))
    _write_json(os.path.join(out_dir, "summary.json"), {
        "trace": os.path.abspath(trace_path), "window": window, "seed": seed, "predictor": predictor,
        "noise_sigma": noise_sigma, "cost_model": cost.to_json(), "scheduler": config.to_json(),
        "saturation": sat, "results": [p.to_json() for p in points],
    })
    if not no_plots:
        plot_vs_load([p.summary for p in points], os.path.join(out_dir, "latency_vs_load.png"),
                     os.path.basename(trace_path), sat,
                     {(p.summary.policy, p.summary.qps): p.stable for p in points})
    click.echo(f"wrote {out_dir}/summary.json" + ("" if no_plots else " and latency_vs_load.png"))
