"""`flexlamps agents`: augmented requests (API-call pauses) on the real engine, per policy."""

from __future__ import annotations

import dataclasses
import os

import click

from flexlamps.commands.options import (ByteSize, check_model, check_offload_dir, check_policy, engine_settings_from,
                                        hold_output, model_options, plots_wanted, refused_option,
                                        writable_folder)
from flexlamps.commands.simulate import _floats, _policies, _write_json

_HELP = """Run augmented requests from an INFERCEPT-format --trace on the real engine (paged KV cache,
continuous batching) under each scheduling policy of --schedulers, and print per policy: end-to-end latency (mean, p50,
p99), TTFT, normalized latency ((E2E - API time) / output tokens) and throughput. Writes
summary.json and PNG plots (latency CDF, latency vs load) to OUT.

The trace is scaled down so a CPU runs it in minutes: --num-requests requests are drawn from its
templates with Poisson arrivals at each QPS (per second of engine time, see --clock); prompts are cut to
--max-prompt tokens, each segment's output to --max-output, each call's returned tokens to
--max-api-tokens, the whole context to --max-context (the segment that would cross it ends the
request); API durations are multiplied by --time-scale and waited for (slept through with
--clock wall, skipped in engine time with --clock cpu). Prompt and returned tokens are deterministic filler ids per template (text segments are counted with
the model's tokenizer); outputs are the model's greedy tokens.

The gpu tier holds --gpu-kv-mem of KV blocks and the cpu tier --cpu-swap-mem of swap space;
make the gpu pool small next to the offered load so the policies' memory choices matter. With
--gpu-mem and --cpu-mem (the tiers' budgets) the model runs on the offload executor instead:
--placement places the weights across gpu / cpu / disk (--offload-dir), the gpu KV pool is what
the gpu budget leaves once the weights and the largest iteration's working set are in, and the
swap pool what the cpu budget leaves; peak use of each tier and the bytes swapped are printed.
The scheduler's cost model (prefill / decode / swap cost) is measured on this machine first.

Live agents instead of a trace: --self-debug FILE (HumanEval-format tasks: the model writes the
function, its tests run, it reads the failure and repairs, up to --rounds rounds), --gsm8k FILE
(a Python calculator tool, scored by the final answer) or --tools module.py --prompts FILE (the
model calls the file's functions with <tool_call>{json}</tool_call>). A request generates until
it calls a tool, pauses while the tool runs in a sandbox (bubblewrap: its own namespaces, no network,
a read-only filesystem, a seccomp filter, --tool-timeout; without bubblewrap the command refuses unless
--unsafe-tools) on a thread pool while the others decode, then resumes with the result as a new
turn; the scheduler learns call durations per tool as they happen. All tasks arrive at once.
Writes OUT/<policy>.jsonl (per task: every round's completion, the program run, its result and
time) and OUT/summary.json (per policy: E2E mean / p99, throughput, tool calls and seconds, bytes
swapped, preserve / swap / discard counts, pass@1 after each round or accuracy); a policy already
in OUT with the same settings is kept (rerun to resume)."""


@click.command("agents", help=_HELP)
@model_options
@click.option("--trace", "trace_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="INFERCEPT-format trace, e.g. ../shared/data/augmented/merged_exp_uniform.json")
@click.option("--self-debug", "self_debug", default=None, type=click.Path(exists=True, dir_okay=False),
              help="live Self-Debugging on HumanEval-format tasks (.jsonl or .jsonl.gz): write, test, repair")
@click.option("--gsm8k", default=None, type=click.Path(exists=True, dir_okay=False),
              help="live program-aided GSM8K (.jsonl): a Python calculator tool, scored by the final answer")
@click.option("--tools", "tools_module", default=None, type=click.Path(exists=True, dir_okay=False),
              help="live tool calls (<tool_call>{json}</tool_call>) to the functions of this Python file; "
                   "with --prompts")
@click.option("--prompts", default=None, type=click.Path(exists=True, dir_okay=False),
              help="with --tools: the requests (.jsonl {id, prompt} or one per line)")
@click.option("--rounds", default=2, type=click.IntRange(min=1), show_default=True,
              help="live: rounds of write-and-test (self-debug) or tool calls per task at most")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="live: the first N tasks only")
@click.option("--max-new-tokens", default=128, type=click.IntRange(min=1), show_default=True,
              help="live: tokens the model writes per turn at most")
@click.option("--tool-timeout", default=10.0, type=click.FloatRange(min=0.1), show_default=True,
              help="live: wall seconds (and CPU seconds) a tool call may take before it is stopped")
@click.option("--unsafe-tools", is_flag=True,
              help="live: run model-written and tool code without the OS sandbox where bubblewrap is missing "
                   "(resource limits and an audit hook only: the code can read and write what this process can)")
@click.option("--tool-workers", default=2, type=click.IntRange(min=1), show_default=True,
              help="live: tool calls running at once")
@click.option("--recheck", is_flag=True, help="self-debug: run every recorded program again and compare")
@click.option("--schedulers", "--policies", "schedulers", default="lamps,infercept,fcfs", callback=_policies,
              show_default=True, help="scheduling policies to run, comma-separated: fcfs, infercept, sjf, lamps, "
                                      "mlfq, vtc (--policies: the same, as simulate takes it)")
@click.option("--qps", default="0.5", callback=_floats, show_default=True,
              help="comma-separated arrival rates (requests per second of engine time)")
@click.option("--num-requests", default=16, type=click.IntRange(min=1), show_default=True, help="requests drawn from the trace per load")
@click.option("--time-scale", default=0.1, type=click.FloatRange(min=0.0), show_default=True,
              help="wall seconds waited per trace second of API time")
@click.option("--max-context", default=None, type=click.IntRange(min=1),
              help="tokens per request at most [trace: 256; live: fits the longest prompt and every round]")
@click.option("--max-prompt", default=96, type=click.IntRange(min=1), show_default=True, help="prompt tokens at most")
@click.option("--max-output", default=24, type=click.IntRange(min=1), show_default=True, help="tokens decoded per segment at most")
@click.option("--max-api-tokens", default=24, type=click.IntRange(min=1), show_default=True, help="tokens a call returns at most")
@click.option("--gpu-kv-mem", default=None, type=ByteSize(),
              help="KV pool on the gpu tier (e.g. 24MiB); sets the number of blocks [trace: 24MiB; live: 4 contexts]")
@click.option("--cpu-swap-mem", default=None, type=ByteSize(zero_ok=True),
              help="swap space on the cpu tier (0 disables swapping) [trace: 8MiB; live: 4 contexts]")
@click.option("--gpu-mem", default=None, type=ByteSize(),
              help="gpu tier budget (e.g. 64MiB): offloads the weights and sizes the KV pool (overrides --gpu-kv-mem)")
@click.option("--cpu-mem", default=None, type=ByteSize(),
              help="cpu tier budget, with --gpu-mem: holds offloaded weights and the swap pool "
                   "(overrides --cpu-swap-mem)")
@click.option("--offload-dir", default=None, type=click.Path(file_okay=False),
              help="folder for weights the policy puts on disk (with --gpu-mem)")
@click.option("--placement", default="auto", show_default=True,
              help="weight placement with --gpu-mem: auto (the planner) or a policy JSON from `flexlamps plan`")
@refused_option("--policy", "agents runs two kinds of policy: give the weight placement as --placement and the "
                            "scheduling policies as --schedulers")
@click.option("--block-size", default=16, type=click.IntRange(min=1), show_default=True, help="tokens per KV block")
@click.option("--max-num-seqs", default=16, type=click.IntRange(min=1), show_default=True, help="requests per iteration at most")
@click.option("--max-batched-tokens", default=256, type=click.IntRange(min=1), show_default=True,
              help="tokens per iteration at most (longer prefills and recomputes are chunked)")
@click.option("--noise-sigma", default=0.0, type=click.FloatRange(min=0.0), show_default=True,
              help="multiplicative Gaussian noise on the oracle predictions")
@click.option("--seed", default=0, show_default=True, help="seed of the replay (templates drawn, arrivals)")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="wall: real time, API waits slept through; cpu: this process's CPU time, API waits "
                   "skipped (latencies other jobs on a shared machine cannot stretch; use one thread)")
@click.option("--verify", is_flag=True,
              help="check every request's output against its uninterrupted generation (slower)")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="folder for summary.json and the PNG plots")
@click.option("--no-plots", is_flag=True, help="skip the matplotlib plots")
def command(model, dtype, trace_path, self_debug, gsm8k, tools_module, prompts, rounds, limit, max_new_tokens,
            tool_timeout, unsafe_tools, tool_workers, recheck, schedulers, qps, num_requests, time_scale, max_context, max_prompt,
            max_output, max_api_tokens, gpu_kv_mem, cpu_swap_mem, gpu_mem, cpu_mem, offload_dir, placement,
            block_size, max_num_seqs, max_batched_tokens, noise_sigma, seed, clock, verify, out_dir, no_plots):
    from flexlamps.engine.augmented.run import measure_cost
    from flexlamps.workloads.tokenized import TraceScale, load_trace
    from flexlamps.workloads.trace import load_templates

    if (gpu_mem is None) != (cpu_mem is None):
        raise click.UsageError("give --gpu-mem and --cpu-mem together (the tiers' budgets), or neither")
    if offload_dir is not None and gpu_mem is None:
        raise click.UsageError("--offload-dir needs the tiers' budgets: give --gpu-mem and --cpu-mem")
    check_model(model)
    writable_folder(out_dir, "--out")  # before the model loads
    hold_output(out_dir, "--out")
    check_offload_dir(offload_dir)
    check_policy(placement)
    run = engine_settings_from(model, dtype, dict(gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=offload_dir,
                                                   policy=placement))
    shape = dict(block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched_tokens,
                 noise_sigma=noise_sigma, seed=seed, gpu_kv_mem=gpu_kv_mem, cpu_swap_mem=cpu_swap_mem)
    workload = _live_workload(trace_path, self_debug, gsm8k, tools_module, prompts, rounds, limit, tool_timeout,
                              unsafe_tools)
    if workload is not None:
        from flexlamps.commands.agents_live import run_live

        augmented = augmented_settings(max_context or workload.context_for(max_new_tokens, rounds), **shape)
        return run_live(workload=workload, run=run, augmented=augmented, schedulers=schedulers,
                        max_new_tokens=max_new_tokens, rounds=rounds, tool_workers=tool_workers, out_dir=out_dir,
                        recheck=recheck)
    no_plots = not plots_wanted(no_plots)  # the trace's run draws plots; a live one does not
    shape.update(gpu_kv_mem=24 << 20 if gpu_kv_mem is None else gpu_kv_mem,
                 cpu_swap_mem=8 << 20 if cpu_swap_mem is None else cpu_swap_mem)
    augmented = augmented_settings(max_context or 256, **shape)
    try:
        scale = TraceScale(time_scale=time_scale, max_prompt=max_prompt, max_segment_output=max_output,
                           max_api_tokens=max_api_tokens, max_context=augmented.max_context)
        load_templates(trace_path)  # a bad trace fails before the model loads (counted again with its tokenizer)
        llm, plan = load_planned(run, augmented)
        templates = load_trace(llm, trace_path)
    except ValueError as e:
        raise click.ClickException(str(e))
    if verify and str(llm.dtype) != "torch.float32":
        click.echo(_VERIFY_LOW_PRECISION.format(str(llm.dtype).removeprefix("torch.")), err=True)
    click.echo("measuring the cost model on this machine ...")
    cost = measure_cost(llm.executor, plan.pools, augmented.max_context, cpu_clock=clock == "cpu")
    try:
        results = _run_all(llm, templates, scale, plan.pools, cost, schedulers, qps, num_requests, seed, verify, clock)
    except ValueError as e:  # NonFiniteLogitsError: a model whose weights hold NaN
        raise click.ClickException(f"--model {model}: {e}") from None
    _report(results, trace_path, out_dir, no_plots, dict(
        model=model, dtype=dtype, trace=os.path.abspath(trace_path), num_requests=num_requests, seed=seed,
        scale=scale.__dict__, config=plan.pools.to_json(), clock=clock, cost_model=cost.to_json(),
        placement=plan.policy.to_dict() if plan.offloaded else None))
    llm.close()


def augmented_settings(max_context: int, **fields):
    """The augmented face's settings, parsed once; a bad value is a UsageError naming it."""
    from flexlamps.settings import AugmentedSettings

    try:
        return AugmentedSettings.parse(max_context=max_context, **fields)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _live_workload(trace_path, self_debug, gsm8k, tools_module, prompts, rounds, limit, tool_timeout, unsafe_tools):
    """The live workload the options name (read and checked before the model loads), or None for --trace."""
    given = {"--trace": trace_path, "--self-debug": self_debug, "--gsm8k": gsm8k, "--tools": tools_module}
    named = [k for k, v in given.items() if v is not None]
    if len(named) != 1:
        raise click.UsageError("give one workload: --trace, --self-debug, --gsm8k or --tools (with --prompts)"
                               + (f"; got {' and '.join(named)}" if named else ""))
    if prompts is not None and tools_module is None:
        raise click.UsageError("--prompts goes with --tools")
    if trace_path is not None:
        return None
    _check_tool_sandbox(unsafe_tools)
    from flexlamps.agents.workloads import load_workload

    name, path = {"--self-debug": ("self-debug", self_debug), "--gsm8k": ("gsm8k", gsm8k),
                  "--tools": ("tools", tools_module)}[named[0]]
    try:
        return load_workload(name, path, rounds=rounds, limit=limit, tool_timeout=tool_timeout, prompts=prompts,
                             unsafe_tools=unsafe_tools)
    except ValueError as e:
        raise click.ClickException(str(e))


def _check_tool_sandbox(unsafe_tools: bool) -> None:
    """Model-written code runs behind the OS sandbox, or the user asked for none by name."""
    from flexlamps.tools.sandbox import boundary_problem

    if unsafe_tools:
        click.echo("warning: --unsafe-tools: model-written and tool code runs without the OS sandbox; it can read, "
                   "write and signal whatever this process can", err=True)
        return
    problem = boundary_problem()
    if problem is not None:
        raise click.ClickException(f"{problem}; or pass --unsafe-tools to run model-written code without it")


def load_planned(run, augmented):
    """The model, planned and built for the augmented run (`LLM.prepare_augmented`); offloaded,
    the placement and the pools its budgets leave are printed."""
    from flexlamps.api import LLM
    from placement import format_bytes

    llm = LLM.from_settings(run)
    plan = llm.prepare_augmented(augmented)
    if not plan.offloaded:
        return llm, plan
    w, use, sizes = plan.policy.weights, llm.executor.tier_use(), llm.pool_sizes
    click.echo(f"placement: weights {w.gpu:.0%} gpu / {w.cpu:.0%} cpu / {w.disk:.0%} disk "
               f"({format_bytes(use['gpu'].used_bytes)} gpu, {format_bytes(use['cpu'].used_bytes)} cpu resident)")
    click.echo(f"planner: gpu KV pool {format_bytes(sizes.gpu_kv_bytes)}, cpu swap pool "
               f"{format_bytes(sizes.cpu_swap_bytes)} (budgets {format_bytes(run.gpu_mem)} / "
               f"{format_bytes(run.cpu_mem)}; working set {format_bytes(sizes.gpu_working_set)} gpu, "
               f"{format_bytes(sizes.cpu_working_set)} cpu)")
    return llm, plan


def _run_all(llm, templates, scale, config, cost, policies, qps, num_requests, seed, verify, clock):
    from tqdm import tqdm

    from flexlamps.engine.augmented.engine import CpuClock, WallClock
    from flexlamps.engine.augmented.reference import uninterrupted_tokens
    from flexlamps.engine.augmented.run import run_policy_on_engine
    from flexlamps.workloads.tokenized import replay_requests
    from flexlamps.sim.metrics import summarize

    results, plain = [], _reference_executor(llm) if verify else None
    for load in qps:
        pool_tokens = cost.gpu_kv_tokens
        if scale.max_context >= pool_tokens:
            raise click.ClickException(f"--max-context {scale.max_context} does not fit the gpu KV pool "
                                       f"({pool_tokens} tokens); raise --gpu-kv-mem or lower --max-context")
        requests = replay_requests(llm, templates, scale, load, num_requests, seed)
        expected = uninterrupted_tokens(plain, requests) if verify else None
        for policy in policies:
            with tqdm(total=len(requests), desc=f"{policy} qps {load:g}", unit="req", leave=False) as bar:
                res = run_policy_on_engine(llm.executor, requests, policy, config, cost, on_finish=lambda rec: bar.update(),
                                           clock=CpuClock() if clock == "cpu" else WallClock())
            mismatched = None
            if expected is not None:
                mismatched = sorted(rid for rid, toks in res.tokens.items() if toks != expected[rid])
            summary = summarize(res.records, policy, load, res.end_time)
            results.append((summary, res, mismatched))
    return results


_VERIFY_LOW_PRECISION = (
    "note: in {} --verify compares each output with the same engine's own uninterrupted generation (its weights "
    "and kernels; an in-memory run keeps 4-bit weights in another form). Exact equality would need kernels whose "
    "rows do not depend on the step's shapes: oneDNN's bf16 GEMM is so on CPUs without AMX, but not with AMX (a row "
    "may move by one bf16 rounding step), nor are 4-bit weights (another kernel from 128 rows) or bf16 attention "
    "(torch's flash kernel: a token may move by a rounding step with the rows and chunks of its step); a near-tie "
    "may then flip a token. Outputs that differ are listed. float32 (--dtype float32) is exact and is also checked "
    "against the model all in memory.")


def _reference_executor(llm):
    """What every output must equal when generated alone. float32: the model all in memory, outside
    the tiers' budgets (it also checks the offloading, bit for bit). Other dtypes: the engine's own
    executor, one request at a time (see _VERIFY_LOW_PRECISION)."""
    if llm.offload is None or str(llm.dtype) != "torch.float32":
        return llm.executor
    from flexlamps.api import LLM

    return LLM(llm.model_name, dtype=str(llm.dtype).removeprefix("torch.")).executor


def _report_memory(results) -> None:
    """Per run: each budgeted tier's peak against its budget, and the KV bytes swapped to cpu."""
    from placement import format_bytes

    for s, res, _ in results:
        peaks = [f"peak {tier} {format_bytes(u.peak_bytes)} of {format_bytes(u.capacity_bytes)}"
                 for tier, u in res.tier_use.items() if u.capacity_bytes is not None]
        if peaks:
            click.echo(f"{s.policy} qps {s.qps:g}: {', '.join(peaks)}; swapped "
                       f"{format_bytes(res.swapped_out_bytes)} to the cpu tier")


def _report(results, trace_path, out_dir, no_plots, meta: dict) -> None:
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
    if not no_plots:
        from flexlamps.sim.plots import plot_cdf, plot_vs_load

        name = os.path.basename(trace_path)
        by_load: dict[float, dict[str, list[float]]] = {}
        for s, res, _ in results:
            by_load.setdefault(s.qps, {})[s.policy] = [r.e2e for r in res.records]
        for load, by_policy in by_load.items():
            plot_cdf(by_policy, f"E2E CDF (real engine), {name}, qps {load:g}",
                     os.path.join(out_dir, f"cdf_qps{load:g}.png"))
        plot_vs_load([s for s, _, _ in results], os.path.join(out_dir, "latency_vs_load.png"), name)
    click.echo(f"wrote {out_dir}/summary.json" + ("" if no_plots else " and PNG plots"))
    if any(m for _, _, m in results):
        raise click.ClickException("some outputs differ from their uninterrupted generation (see above)")
