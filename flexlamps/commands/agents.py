"""`flexlamps agents`: augmented requests (API-call pauses) on the real engine, per policy."""

from __future__ import annotations

import click

from flexlamps.agents.workloads import load_workload
from flexlamps.commands.agents_live import run_live
from flexlamps.commands.agents_setup import augmented_settings
from flexlamps.commands.agents_trace import TraceReplay, run_trace
from flexlamps.commands.options import (ByteSize, check_model, check_offload_dir, check_policy, engine_settings_from,
                                        hold_output, model_options, plots_wanted, refused_option,
                                        writable_folder)
from flexlamps.commands.simulate import _floats, _policies
from flexlamps.tools import sandbox
from flexlamps.workloads.tokenized import TraceScale

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
def command(**options):
    if (options["gpu_mem"] is None) != (options["cpu_mem"] is None):
        raise click.UsageError("give --gpu-mem and --cpu-mem together (the tiers' budgets), or neither")
    if options["offload_dir"] is not None and options["gpu_mem"] is None:
        raise click.UsageError("--offload-dir needs the tiers' budgets: give --gpu-mem and --cpu-mem")
    check_model(options["model"])
    writable_folder(options["out_dir"], "--out")  # before the model loads
    hold_output(options["out_dir"], "--out")
    check_offload_dir(options["offload_dir"])
    check_policy(options["placement"])
    run = engine_settings_from(options["model"], options["dtype"], dict(
        gpu_mem=options["gpu_mem"], cpu_mem=options["cpu_mem"], offload_dir=options["offload_dir"],
        policy=options["placement"]))
    shape = {k: options[k] for k in ("block_size", "max_num_seqs", "noise_sigma", "seed", "gpu_kv_mem", "cpu_swap_mem")}
    shape["max_num_batched_tokens"] = options["max_batched_tokens"]
    workload = _live_workload(**{k: options[k] for k in _WORKLOAD_OPTIONS})
    if workload is not None:
        context = options["max_context"] or workload.context_for(options["max_new_tokens"], options["rounds"])
        return run_live(workload=workload, run=run, augmented=augmented_settings(context, **shape),
                        **{k: options[k] for k in ("schedulers", "max_new_tokens", "rounds", "tool_workers",
                                                   "out_dir", "recheck")})
    plots = plots_wanted(options["no_plots"])  # the trace's run draws plots; a live one does not
    shape.update(gpu_kv_mem=24 << 20 if shape["gpu_kv_mem"] is None else shape["gpu_kv_mem"],
                 cpu_swap_mem=8 << 20 if shape["cpu_swap_mem"] is None else shape["cpu_swap_mem"])
    augmented = augmented_settings(options["max_context"] or 256, **shape)
    try:
        scale = TraceScale(time_scale=options["time_scale"], max_prompt=options["max_prompt"],
                           max_segment_output=options["max_output"], max_api_tokens=options["max_api_tokens"],
                           max_context=augmented.max_context)
    except ValueError as e:
        raise click.ClickException(str(e))
    replay = TraceReplay(schedulers=options["schedulers"], qps=options["qps"], num_requests=options["num_requests"],
                         seed=options["seed"], verify=options["verify"], clock=options["clock"], plots=plots)
    run_trace(options["trace_path"], run, augmented, scale, replay, options["out_dir"])


# the options that choose and read the workload (--trace, or a live one)
_WORKLOAD_OPTIONS = ("trace_path", "self_debug", "gsm8k", "tools_module", "prompts", "rounds", "limit", "tool_timeout",
                     "unsafe_tools")


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

    name, path = {"--self-debug": ("self-debug", self_debug), "--gsm8k": ("gsm8k", gsm8k),
                  "--tools": ("tools", tools_module)}[named[0]]
    try:
        return load_workload(name, path, rounds=rounds, limit=limit, tool_timeout=tool_timeout, prompts=prompts,
                             unsafe_tools=unsafe_tools)
    except ValueError as e:
        raise click.ClickException(str(e))


def _check_tool_sandbox(unsafe_tools: bool) -> None:
    """Model-written code runs behind the OS sandbox, or the user asked for none by name."""
    if unsafe_tools:
        click.echo("warning: --unsafe-tools: model-written and tool code runs without the OS sandbox; it can read, "
                   "write and signal whatever this process can", err=True)
        return
    problem = sandbox.boundary_problem()
    if problem is not None:
        raise click.ClickException(f"{problem}; or pass --unsafe-tools to run model-written code without it")


