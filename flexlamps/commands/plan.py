"""`flexlamps plan`: pick a placement policy for a model on a machine and print it.

Imports `placement` and the API's torch-free catalog (`flexlamps.catalog`), so it answers in well under a
second.
"""

import dataclasses
import json
from pathlib import Path

import click

from placement import (
    EngineCapabilities,
    HardwareSpec,
    InfeasiblePlanError,
    LatentMissCurves,
    ModelSpec,
    Plan,
    Policy,
    WorkloadSpec,
    evaluate,
    format_bytes,
    hardware_preset,
    solve,
)
from placement.plan import TIERS
from placement.presets import HARDWARE_PRESETS
from placement.units import GiB

from flexlamps.catalog import describe_model
from flexlamps.commands.memory import cpu_mem_within, overheads_text
from flexlamps.commands.options import ByteSize
from placement.ess import pool_entries
from placement.hybrid_fit import all_full_attention, sequences_that_fit


def load_model_spec(text: str) -> ModelSpec:
    """A model from a config.json path, an HF folder holding one, a GGUF file, or a preset name."""
    try:
        return describe_model(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None


def load_hardware_spec(text: str) -> HardwareSpec:
    """A machine from a profile.json written by `flexlamps profile`, or a preset name."""
    path = Path(text)
    if path.is_file():
        try:
            return HardwareSpec.from_json(path.read_text())
        except ValueError as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="--hardware") from None
    try:
        return hardware_preset(text)
    except KeyError:
        raise click.BadParameter(
            f"{text!r} is neither a profile.json nor a preset ({', '.join(HARDWARE_PRESETS)})",
            param_hint="--hardware") from None


def _load_policy(path: Path) -> Policy:
    """A policy from its own JSON, a plan's JSON, or `flexlamps plan --json` output."""
    try:
        data = json.loads(path.read_text())
        for key in ("plan", "policy"):  # unwrap the enclosing documents
            if isinstance(data, dict) and key in data:
                data = data[key]
        return Policy.from_dict(data)
    except ValueError as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--placement") from None


def format_plan(plan: Plan, model: ModelSpec, hardware: HardwareSpec,
                workload: WorkloadSpec, all_full_plan: Plan | None = None) -> str:
    """`all_full_plan`: for a hybrid model, the plan of the same model with every layer full
    attention (None: nothing fits it), shown beside this one."""
    pol = plan.policy
    lines = [
        f"model     {model.name} ({model.arch}, {model.num_layers} layers, {_weight_words(model)})",
        *_window_lines(model, workload, plan.policy.compress_cache),
        f"hardware  {hardware.name}",
        f"workload  prompt {workload.prompt_len}, output {workload.gen_len}, "
        f"shared prefix {workload.shared_prefix_len}",
        "",
        f"policy    gpu batch {pol.gpu_batch_size} x {pol.num_gpu_batches} micro-batches "
        f"= block {pol.block_size}"
        + (f", decoded {'merged' if pol.merge_decode else 'one by one'}" if pol.num_gpu_batches > 1 else ""),
        f"          compress weights {'yes' if pol.compress_weight else 'no'}, "
        f"cache {'yes' if pol.compress_cache else 'no'} "
        f"({pol.compression.num_bits}-bit, group {pol.compression.group_size}); "
        f"cpu attention {'yes' if pol.cpu_attention else 'no'}",
        "",
        f"{'':14}{'gpu':>9}{'cpu':>9}{'disk':>9}",
    ]
    for label, split in (("weights", pol.weights), ("cache", pol.cache),
                         ("activations", pol.activations)):
        lines.append(f"{label:14}" + "".join(f"{100 * v:8.1f}%" for v in split.as_tuple()))
    for label, table in (("peak (GiB)", plan.peak_bytes), ("budget (GiB)", plan.budget_bytes)):
        lines.append(f"{label:14}" + "".join(f"{table[t] / GiB:9.1f}" for t in TIERS))
    lines += _latent_pool_lines(plan, model, hardware, workload)
    lines += _expert_lines(plan, model)
    lines += _hybrid_lines(plan, model, hardware, workload, all_full_plan)
    lines += [
        "",
        f"throughput  {plan.tokens_per_s:.2f} tokens/s "
        f"(block of {pol.block_size} x {workload.gen_len} tokens in {plan.total_s:.1f} s)",
        f"time split  prefill {plan.prefill_s:.1f} s, decode {plan.decode_s:.1f} s",
        "per layer   " + "  ".join(f"{k} {v * 1e3:.1f}ms" for k, v in plan.prefill_layer_s.items())
        + "  (prefill)",
        "            " + "  ".join(f"{k} {v * 1e3:.1f}ms" for k, v in plan.decode_layer_s.items())
        + "  (decode)",
        f"binding     {plan.binding_constraint}",
        (f"search      {plan.num_lps_solved} LPs in {plan.search_s:.2f} s" if plan.num_lps_solved
         else "search      none (policy given)"),
    ]
    return "\n".join(lines)


def _weight_words(model: ModelSpec) -> str:
    """The weights' bytes as the engine holds them: a GGUF's blocks kept as codes said apart."""
    dtype = "fp8" if model.weight_format == "fp8" else model.dtype
    codes = model.tensors.codes_bytes()
    if not codes:
        return f"{format_bytes(model.total_weight_bytes())} of {dtype} weights"
    return (f"{format_bytes(model.total_weight_bytes())} of weights: {format_bytes(codes)} of the file's blocks "
            f"kept as codes, the rest {dtype}")


def _window_lines(model: ModelSpec, workload: WorkloadSpec, compressed: bool) -> list[str]:
    """A model with sliding-window layers: what their rings hold at the workload's context (a
    compressed cache keeps every position)."""
    windows = sorted({w for w in model.layer_windows if w})
    if not windows:
        return []
    sliding = sum(1 for w in model.layer_windows if w)
    context = workload.prompt_len + workload.gen_len
    held = "every position (the cache is compressed)" if compressed else (
        f"their last {'/'.join(map(str, windows))} positions: a sequence's cache at {context} tokens is "
        f"{model.held_tokens(context) / context:.1%} of the whole context's")
    return [f"windows   {sliding} of {model.num_layers} layers slide and keep {held}"]


def _expert_lines(plan: Plan, model: ModelSpec) -> list[str]:
    """A MoE model's routing as priced and where its cpu-tier experts are computed."""
    if not model.num_experts:
        return []
    block = plan.policy.block_size
    routing = "measured" if model.routing is not None and model.routing.tokens else "uniform"
    switch = plan.policy.cpu_expert_tokens
    where = ("copied to the gpu tier" if not switch
             else f"on the CPU where they live below {switch} tokens per expert, else copied")
    group = plan.policy.expert_group
    staged = f"streamed {group} at a time" if group else "staged together for a layer"
    return [f"experts   {routing} routing: {model.expected_experts(1):.1f} of {model.num_experts} a token, "
            f"{model.expected_experts(block):.1f} a decode step of the block; cpu-tier experts {where}; "
            f"off-gpu experts {staged}"]


def _hybrid_lines(plan: Plan, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec,
                  all_full_plan: Plan | None) -> list[str]:
    """A hybrid model's cache (fixed state per sequence, KV in the full-attention layers only) and
    how many sequences fit: for each model, the most that either plan's placement holds (the same
    placements for both, so the count reflects the cache, not one plan's choices), beside the same
    model with every layer full attention."""
    if not model.num_linear_layers:
        return []

    full_model = all_full_attention(model)
    policies = [plan.policy] + ([all_full_plan.policy] if all_full_plan is not None else [])
    ours = max(sequences_that_fit(p, model, hardware, workload).sequences for p in policies)
    dense = max(sequences_that_fit(p, full_model, hardware, workload).sequences for p in policies)
    planned = ("no plan fits it" if all_full_plan is None else
               f"planned block {all_full_plan.policy.block_size}, {all_full_plan.tokens_per_s:.2f} tokens/s")
    ratio = f"{ours / dense:.1f}x the sequences" if dense else "none fit all full attention"
    context = workload.prompt_len + workload.gen_len
    per_seq = model.num_layers * (model.cache_bytes_per_token_per_layer() * context
                                  + model.state_bytes_per_sequence_per_layer())
    per_seq_full = full_model.num_layers * full_model.cache_bytes_per_token_per_layer() * context
    return ["", f"hybrid    {model.num_linear_layers} DeltaNet layers hold "
                f"{format_bytes(model.num_layers * model.state_bytes_per_sequence_per_layer())} of state a "
                f"sequence; KV in {model.num_layers - model.num_linear_layers} full-attention layers only",
            f"          cache a sequence at {context} tokens (uncompressed): {format_bytes(per_seq)}; "
            f"all full attention {format_bytes(per_seq_full)}",
            f"          sequences that fit: {ours} (planned block {plan.policy.block_size}); all full attention: "
            f"{dense} ({planned}); {ratio}"]


def _latent_pool_lines(plan: Plan, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec) -> list[str]:
    """ESS's layout for sparse-attention MLA models with part of the cache off the gpu tier:
    each layer's pool, where the miss curves come from, and what one global fraction would give."""
    pol = plan.policy
    if not model.index_topk or pol.cache.gpu >= 1:
        return []

    context = workload.prompt_len + workload.gen_len
    fractions = pol.latent_pools or (pol.cache.gpu,) * model.num_layers
    pools = [pool_entries(model.index_topk, f, context) for f in fractions]
    curves = hardware.latent_miss_curves or LatentMissCurves.ess()
    lines = [f"latent pools  indexer keys on the gpu tier, latent records on the cpu tier; gpu pool entries "
             f"a sequence per layer (of {context}, top-k {model.index_topk}), min {min(pools)}, "
             f"mean {sum(pools) / len(pools):.0f}, max {max(pools)}:",
             *("              " + " ".join(f"{p:6d}" for p in pools[i:i + 10]) for i in range(0, len(pools), 10)),
             f"              miss curves: {curves.source}"]
    if pol.latent_pools:
        uniform = dataclasses.replace(pol, latent_pools=(pol.cache.gpu,) * model.num_layers)
        alone = evaluate(uniform, model, hardware, workload)
        lines.append(f"              one pool fraction for every layer ({pol.cache.gpu:.1%}) instead: "
                     f"{alone.tokens_per_s:.2f} tokens/s ({plan.tokens_per_s / alone.tokens_per_s - 1:+.1%} "
                     "for the per-layer pools)")
    return lines


def _all_full_attention_plan(model, hardware, workload, plan, given_policy: bool, usable_fraction, compress,
                             cpu_attention, merged_decode, cache_on_disk) -> Plan | None:
    """A hybrid model's comparison: the same model with every layer full attention, planned with
    the same options (or the given policy evaluated); None for other models or when nothing fits."""
    if not model.num_linear_layers:
        return None

    full = all_full_attention(model)
    if given_policy:
        return evaluate(plan.policy, full, hardware, workload, usable_fraction=usable_fraction)
    try:
        return solve(full, hardware, workload, usable_fraction=usable_fraction, allow_weight_compression=compress,
                     allow_cache_compression=compress, allow_cpu_attention=cpu_attention,
                     allow_merged_decode=merged_decode,
                     capabilities=dataclasses.replace(EngineCapabilities(), cache_on_disk=cache_on_disk))
    except InfeasiblePlanError:
        return None


def _cpu_tier_within(hardware: HardwareSpec, max_rss: int, model: ModelSpec) -> HardwareSpec:
    """The machine with the cpu tier `--max-rss` leaves (`memory.cpu_mem_within`), said on stderr."""
    cpu_mem = cpu_mem_within(max_rss, hardware.gpu_mem_bytes, hardware.gpu_is_host, model)
    overheads = overheads_text(model, format_bytes)
    if cpu_mem <= 0:
        raise click.BadParameter(f"{format_bytes(max_rss)} leaves no cpu tier after {overheads} and the gpu tier",
                                 param_hint="--max-rss")
    click.echo(f"cpu tier {format_bytes(cpu_mem)} (--cpu-mem {cpu_mem}): what --max-rss {format_bytes(max_rss)} leaves "
               f"after {overheads}" + (" and the gpu tier (host memory on this machine)" if hardware.gpu_is_host else ""),
               err=True)
    return hardware.with_memory(cpu_mem_bytes=cpu_mem)


@click.command("plan")
@click.option("--model", "model_text", required=True,
              help="config.json, an HF model folder, a GGUF file, or a preset (e.g. opt-30b, llama-3-8b).")
@click.option("--hardware", "hardware_text", default="t4-flexgen", show_default=True,
              help="profile.json from `flexlamps profile`, or a preset (t4-flexgen, rtx4090, a100-80gb, ...).")
@click.option("--prompt-len", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--gen-len", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--shared-prefix-len", type=click.IntRange(min=0), default=0, show_default=True,
              help="Leading prompt tokens shared by all sequences (computed once).")
@click.option("--gpu-mem", type=ByteSize(), help="Override the GPU memory, e.g. 2GiB.")
@click.option("--cpu-mem", type=ByteSize(), help="Override the CPU memory, e.g. 64GiB.")
@click.option("--disk-mem", type=ByteSize(), help="Override the disk space, e.g. 1TB.")
@click.option("--max-rss", type=ByteSize(),
              help="A memory cap on the whole process (e.g. a container's): without --cpu-mem, the cpu tier is "
                   "what it leaves after the engine's fixed overhead (and the gpu tier, on a machine without a "
                   "GPU); the number is printed: pass it as generate's --cpu-mem, or give generate --max-rss.")
@click.option("--usable-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.9,
              show_default=True, help="Share of each tier's capacity the plan may fill.")
@click.option("--compress/--no-compress", default=True, show_default=True,
              help="Let the search quantize weights and cache to 4 bits.")
@click.option("--cpu-attention/--no-cpu-attention", default=True, show_default=True,
              help="Let the search run decode attention on the CPU.")
@click.option("--merged-decode/--no-merged-decode", default=True, show_default=True,
              help="Let the search run decode micro-batches merged into one batch per layer "
                   "(--no-merged-decode: one by one, as FlexGen does).")
@click.option("--cache-on-disk/--no-cache-on-disk", default=EngineCapabilities().cache_on_disk,
              show_default=True,
              help="Let the plan keep KV cache layers on disk (the engine maps their files and the OS "
                   "pages them; an MLA latent cache or a DeltaNet state stays in memory).")
@click.option("--placement", "--policy", "policy_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Evaluate this placement policy (JSON, like a plan's \"policy\") instead of searching. "
                   "--policy is FlexGen's name for it.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(model_text, hardware_text, prompt_len, gen_len, shared_prefix_len, gpu_mem,
            cpu_mem, disk_mem, max_rss, usable_fraction, compress, cpu_attention, merged_decode,
            cache_on_disk, policy_path, as_json):
    """Choose where weights, KV cache and activations live (GPU/CPU/disk) and how to batch."""
    model = load_model_spec(model_text)
    hardware = load_hardware_spec(hardware_text).with_memory(
        gpu_mem_bytes=gpu_mem, cpu_mem_bytes=cpu_mem, disk_bytes=disk_mem)
    if max_rss is not None and cpu_mem is None:
        hardware = _cpu_tier_within(hardware, max_rss, model)
    if shared_prefix_len > prompt_len:
        raise click.BadParameter(f"{shared_prefix_len} exceeds --prompt-len {prompt_len}",
                                 param_hint="--shared-prefix-len")
    workload = WorkloadSpec(prompt_len=prompt_len, gen_len=gen_len,
                            shared_prefix_len=shared_prefix_len)
    if policy_path is not None:
        plan = evaluate(_load_policy(policy_path), model, hardware, workload,
                        usable_fraction=usable_fraction)
    else:
        try:
            capabilities = dataclasses.replace(EngineCapabilities(), cache_on_disk=cache_on_disk)
            plan = solve(model, hardware, workload, usable_fraction=usable_fraction,
                         allow_weight_compression=compress, allow_cache_compression=compress,
                         allow_cpu_attention=cpu_attention, allow_merged_decode=merged_decode,
                         capabilities=capabilities)
        except InfeasiblePlanError as exc:
            raise click.ClickException(f"no placement fits: {exc}") from None
    if as_json:
        click.echo(json.dumps({"model": model.to_dict(), "hardware": hardware.to_dict(),
                               "workload": workload.to_dict(), "plan": plan.to_dict()},
                              indent=2))
    else:
        all_full = _all_full_attention_plan(model, hardware, workload, plan, policy_path is not None, usable_fraction,
                                            compress, cpu_attention, merged_decode, cache_on_disk)
        click.echo(format_plan(plan, model, hardware, workload, all_full))
    over = [t for t in TIERS if plan.peak_bytes[t] > plan.budget_bytes[t] * (1 + 1e-6)]
    if over:
        click.echo(f"warning: this policy exceeds the {', '.join(over)} budget", err=True)
    unsupported = EngineCapabilities().unsupported(plan.policy)
    if unsupported:
        click.echo(f"note: flexlamps' engine would not run this policy as planned "
                   f"({'; '.join(unsupported)})", err=True)
