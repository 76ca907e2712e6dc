"""`flexlamps agents --trace`: augmented requests replayed from an INFERCEPT-format trace on the
real engine under each scheduling policy, per arrival rate; latencies, memory and (with --verify)
each output against its uninterrupted generation, reported and written to OUT/summary.json."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

import click
from tqdm import tqdm

from flexlamps.agents.api import measure_cost
from flexlamps.agents.trace_replay import replay_trace
from flexlamps.api import LLM
from flexlamps.commands.agents_setup import load_planned
from flexlamps.commands.simulate import _write_json
from flexlamps.sim.plots import plot_cdf, plot_vs_load
from flexlamps.workloads.tokenized import TraceScale, load_trace
from flexlamps.workloads.trace import load_templates
from placement import format_bytes


@dataclass(frozen=True)
class TraceReplay:
    """How the trace is replayed: per arrival rate of `qps`, `num_requests` drawn with `seed`, run
    under each of `schedulers` on the `clock` ("wall" or "cpu"); `verify`: each output checked
    against its uninterrupted generation; `plots`: PNG plots beside summary.json."""
    schedulers: list[str]
    qps: list[float]
    num_requests: int
    seed: int
    verify: bool
    clock: str
    plots: bool


def run_trace(trace_path: str, run, augmented, scale: TraceScale, replay: TraceReplay, out_dir: str) -> None:
    """Replay `trace_path` on the model `run` (RunSettings) planned for `augmented`
    (AugmentedSettings), scaled by `scale`, as `replay` says; reports and writes OUT/summary.json."""
    try:
        load_templates(trace_path)  # a bad trace fails before the model loads (counted again with its tokenizer)
        llm, plan = load_planned(run, augmented)
        templates = load_trace(llm.tokenizer, trace_path)
    except ValueError as e:
        raise click.ClickException(str(e))
    if replay.verify and str(llm.dtype) != "torch.float32":
        click.echo(_VERIFY_LOW_PRECISION.format(str(llm.dtype).removeprefix("torch.")), err=True)
    click.echo("measuring the cost model on this machine ...")
    cost = measure_cost(llm.executor, plan.pools, augmented.max_context, cpu_clock=replay.clock == "cpu")
    if scale.max_context >= cost.gpu_kv_tokens:
        raise click.ClickException(f"--max-context {scale.max_context} does not fit the gpu KV pool "
                                   f"({cost.gpu_kv_tokens} tokens); raise --gpu-kv-mem or lower --max-context")
    try:
        results = replay_trace(llm.executor, llm.config, templates, scale, plan.pools, cost,
                               policies=replay.schedulers, qps=replay.qps, num_requests=replay.num_requests,
                               seed=replay.seed, clock=replay.clock,
                               reference=_reference_executor(llm) if replay.verify else None, progress=_bar)
    except ValueError as e:  # NonFiniteLogitsError: a model whose weights hold NaN
        raise click.ClickException(f"--model {run.model}: {e}") from None
    _report(results, trace_path, out_dir, replay.plots, dict(
        model=run.model, dtype=run.dtype, trace=os.path.abspath(trace_path), num_requests=replay.num_requests,
        seed=replay.seed, scale=scale.__dict__, config=plan.pools.to_json(), clock=replay.clock,
        cost_model=cost.to_json(), placement=plan.policy.to_dict() if plan.offloaded else None))
    llm.close()


@contextlib.contextmanager
def _bar(policy: str, qps: float, total: int):
    """A progress bar of one (policy, rate) run; the callback it gives ticks per finished request."""
    with tqdm(total=total, desc=f"{policy} qps {qps:g}", unit="req", leave=False) as bar:
        yield lambda record: bar.update()


_VERIFY_LOW_PRECISION = (
    "note: in {} --verify compares each output with the same engine's own uninterrupted generation (its weights "
    "and kernels; an in-memory run keeps 4-bit weights in another form). A row's arithmetic does not depend on the "
    "rows or chunks sharing its step (models/blocks/weight_kind.py), so outputs are equal. Outputs that differ "
    "are listed. float32 (--dtype float32) is also checked against the "
    "model all in memory.")


def _reference_executor(llm):
    """What every output must equal when generated alone. float32: the model all in memory, outside
    the tiers' budgets (it also checks the offloading, bit for bit). Other dtypes: the engine's own
    executor, one request at a time (see _VERIFY_LOW_PRECISION)."""
    if llm.offload is None or str(llm.dtype) != "torch.float32":
        return llm.executor

    return LLM(llm.model_name, dtype=str(llm.dtype).removeprefix("torch.")).executor


def _report_memory(results) -> None:
    """Per run: each budgeted tier's peak against its budget, and the KV bytes swapped to cpu."""
    for s, res, _ in results:
        peaks = [f"peak {tier} {format_bytes(u.peak_bytes)} of {format_bytes(u.capacity_bytes)}"
                 for tier, u in res.tier_use.items() if u.capacity_bytes is not None]
        if peaks:
            click.echo(f"{s.policy} qps {s.qps:g}: {', '.join(peaks)}; swapped "
                       f"{format_bytes(res.swapped_out_bytes)} to the cpu tier")


def _report(results, trace_path, out_dir, plots: bool, meta: dict) -> None:
    header = (f"{'policy':10s} {'qps':>5s} {'n':>4s} {'E2E mean':>9s} {'p50':>7s} {'p99':>7s} "
              f"{'TTFT mean':>9s} {'p50':>7s} {'p99':>7s} {'norm s/tok':>10s} {'req/s':>6s} {'tok/s':>6s} "
              f"{'recomp':>6s} {'swap':>5s} {'P/S/D calls':>12s}")
    click.echo(header)
    rows = []
    for s, res, mismatched in results:
        st = res.stats
        calls = "/".join(str(st.strategies[k]) for k in ("preserve", "swap", "discard"))
        click.echo(f"{s.policy:10s} {s.qps:5g} {s.num_requests:4d} {s.e2e_mean:9.2f} {s.e2e_p50:7.2f} "
                   f"{s.e2e_p99:7.2f} {s.ttft_mean:9.3f} {s.ttft_p50:7.3f} {s.ttft_p99:7.2f} "
                   f"{s.norm_mean:10.4f} {s.throughput_rps:6.3f} {s.throughput_tps:6.1f} "
                   f"{st.recompute_tokens:6d} {st.swap_tokens:5d} {calls:>12s}")
        rows.append({"summary": s.to_json(), "stats": st.__dict__,
                     "records": [r.__dict__ for r in res.records], "swapped_out_bytes": res.swapped_out_bytes,
                     "tier_use": {tier: dataclasses.asdict(use) for tier, use in res.tier_use.items()},
                     "exact": None if mismatched is None else not mismatched,
                     "mismatched": mismatched})
    _report_memory(results)
    for s, _, mismatched in results:
        if mismatched:
            click.echo(f"{s.policy} qps {s.qps:g}: {len(mismatched)} outputs differ from the uninterrupted "
                       f"generation: {', '.join(mismatched[:5])}", err=True)
        elif mismatched is not None:
            click.echo(f"{s.policy} qps {s.qps:g}: verified, all {s.num_requests} outputs equal the uninterrupted "
                       "generation", err=True)
    _write_json(os.path.join(out_dir, "summary.json"), {**meta, "results": rows})
    if plots:
        name = os.path.basename(trace_path)
        by_load: dict[float, dict[str, list[float]]] = {}
        for s, res, _ in results:
            by_load.setdefault(s.qps, {})[s.policy] = [r.e2e for r in res.records]
        for load, by_policy in by_load.items():
            plot_cdf(by_policy, f"E2E CDF (real engine), {name}, qps {load:g}",
                     os.path.join(out_dir, f"cdf_qps{load:g}.png"))
        plot_vs_load([s for s, _, _ in results], os.path.join(out_dir, "latency_vs_load.png"), name)
    click.echo(f"wrote {out_dir}/summary.json" + (" and PNG plots" if plots else ""))
    if any(m for _, _, m in results):
        raise click.ClickException("some outputs differ from their uninterrupted generation (see above)")
