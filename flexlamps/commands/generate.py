"""`flexlamps generate`: JSONL (or text) prompts in, one JSONL record per prompt out, resumable."""

from __future__ import annotations

import resource
import sys
import time
import zlib

import click

from flexlamps.commands.options import model_options


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@click.command("generate")
@model_options
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False),
              help='Input: JSONL lines {"id": ..., "prompt": ...} (extra fields are kept) or a text file, one prompt a line.')
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Output JSONL, one record per prompt. Re-running the same command resumes: finished ids are skipped.")
@click.option("--max-new-tokens", default=64, show_default=True, help="Tokens to generate per prompt at most.")
@click.option("--temperature", default=0.0, show_default=True, help="Sampling temperature; 0 is greedy.")
@click.option("--top-p", default=1.0, show_default=True, help="Nucleus sampling: keep the smallest set of tokens with this much probability.")
@click.option("--top-k", default=0, show_default=True, help="Sample among the k most likely tokens; 0 keeps all.")
@click.option("--seed", default=0, show_default=True, help="Sampling seed; each prompt's seed derives from it and the prompt id, so results do not depend on batching or resuming.")
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--logprobs", is_flag=True, help="Record the log-probability of each generated token.")
@click.option("--chat", is_flag=True, help="Wrap each prompt as a user turn in the model's chat template (instruct models).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the end-of-sequence token.")
@click.option("--batch-size", default=32, show_default=True, help="Sequences decoded together (continuous batching).")
@click.option("--gpu-mem", default=None, help="GPU tier budget (e.g. 2GiB); turns on the offload engine. "
              "Without a GPU the gpu tier is CPU memory, its budget still enforced. [default: off, all in memory]")
@click.option("--cpu-mem", default=None, help="CPU tier budget for offloaded weights and cache (e.g. 8GiB). "
              "[default with --gpu-mem: half the available RAM]")
@click.option("--offload-dir", default=None, type=click.Path(file_okay=False),
              help="Folder for the disk tier; reused across runs when still valid, rebuilt when stale or damaged.")
@click.option("--policy", "policy_arg", default="auto", show_default=True,
              help="Placement with --gpu-mem: 'auto' (the planner, with this machine's cached profile) or a policy JSON file.")
@click.option("--compress-weight", is_flag=True, default=None, help="Store weights 4-bit group-wise on every tier.")
@click.option("--compress-cache", is_flag=True, default=None, help="Store the KV cache 4-bit group-wise.")
@click.option("--weight-quant", type=click.Choice(["groupwise4", "groupwise8", "nf4", "fp4", "none"]), default=None,
              help="Weight compression backend (nf4/fp4 need a bitsandbytes that runs here). [default: groupwise4 "
                   "with --compress-weight, else none]")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def command(model, dtype, prompts_path, out_path, max_new_tokens, temperature, top_p, top_k, seed, stop,
            logprobs, chat, ignore_eos, batch_size, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight,
            compress_cache, weight_quant, no_progress):
    """Generate a completion for every prompt in PROMPTS and write them to OUT."""
    from tqdm import tqdm

    from flexlamps.api import LLM
    from flexlamps.engine.batch.generate import ContextOverflowError
    from flexlamps.engine.batch.sampling import SamplingParams
    from flexlamps.io.prompts import PromptFileError, read_prompts
    from flexlamps.io.results import ResultsError, ResumableResults
    from flexlamps.models.checkpoint import CheckpointError
    from flexlamps.models.config import UnsupportedModelError
    from flexlamps.models.registry import UnknownModelError

    if batch_size < 1:
        raise click.BadParameter("must be >= 1", param_hint="--batch-size")
    try:
        records = read_prompts(prompts_path)
    except PromptFileError as e:
        raise click.ClickException(str(e))
    results = ResumableResults(out_path)
    try:
        done = results.load()
    except ResultsError as e:
        raise click.ClickException(str(e))
    todo = [r for r in records if r.id not in done]
    order = [r.id for r in records]
    if not todo:
        results.open()
        results.finalize(order)
        click.echo(f"all {len(records)} prompts already done in {out_path}")
        return
    if weight_quant and weight_quant != "none":
        compress_weight = True
    offload = gpu_mem is not None or cpu_mem is not None or offload_dir is not None or compress_weight or compress_cache
    try:
        llm = LLM(model, dtype=dtype, max_batch_size=batch_size, gpu_mem=gpu_mem, cpu_mem=cpu_mem,
                  offload_dir=offload_dir, policy=policy_arg, compress_weight=compress_weight,
                  compress_cache=compress_cache, weight_quant=weight_quant)
        base = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                    stop=tuple(stop), logprobs=logprobs, ignore_eos=ignore_eos)
        params = [SamplingParams(seed=zlib.crc32(f"{seed}:{r.id}".encode()), **base) for r in todo]
        prompt_ids = [llm.encode_prompt(r.prompt, chat) for r in todo]
    except (UnknownModelError, UnsupportedModelError, CheckpointError, ValueError, OSError, MemoryError) as e:
        raise click.ClickException(str(e))  # MemoryError: a tier budget that cannot hold the model
    if offload:
        _prepare_offload(llm, prompt_ids, max_new_tokens)
    limit = llm.config.max_position
    for r, ids in zip(todo, prompt_ids):
        if len(ids) >= limit:
            raise click.ClickException(f"prompt id {r.id!r} has {len(ids)} tokens; the model's context is {limit}. "
                                       "Shorten it or drop it from the file.")
    try:
        results.open()
    except (OSError, ResultsError) as e:
        raise click.ClickException(f"cannot write {out_path}: {e}")

    bar = tqdm(total=len(todo), unit="prompt", disable=no_progress, file=sys.stderr, dynamic_ncols=True)
    t0 = time.perf_counter()
    generated = 0

    def on_tokens(n: int) -> None:
        nonlocal generated
        generated += n
        bar.set_postfix_str(f"{generated / max(time.perf_counter() - t0, 1e-9):.1f} tok/s", refresh=False)

    def on_finish(out) -> None:
        rec = todo[out.index]
        row = {"id": rec.id, **rec.extra, "text": out.text, "num_prompt_tokens": out.num_prompt_tokens,
               "num_generated_tokens": len(out.token_ids), "finish_reason": out.finish_reason}
        if out.stop_string is not None:
            row["stop"] = out.stop_string
        if logprobs:
            row["token_ids"] = out.token_ids
            row["logprobs"] = out.logprobs
        results.add(row)
        bar.update(1)

    try:
        llm.generate_ids(prompt_ids, params, on_finish=on_finish, on_tokens=on_tokens)
    except KeyboardInterrupt:
        results.close()
        bar.close()
        click.echo(f"\ninterrupted: {len(results.done)} of {len(records)} done; re-run the same command to resume",
                   err=True)
        sys.exit(130)
    except ContextOverflowError as e:
        raise click.ClickException(str(e))
    bar.close()
    wall = time.perf_counter() - t0
    results.finalize(order)
    skipped = len(records) - len(todo)
    click.echo(f"prompts {len(todo)} (+{skipped} done before) | generated tokens {generated} | "
               f"wall {wall:.1f} s | {generated / wall:.1f} tok/s | peak RSS {_peak_rss_mib():.0f} MiB")
    if offload:
        b = llm.executor.budgets
        click.echo(f"measured {generated / wall:.2f} tok/s | peak gpu tier {b['gpu'].peak_bytes / 2**20:.0f} MiB of "
                   f"{b['gpu'].capacity_bytes / 2**20:.0f} | peak cpu tier {b['cpu'].peak_bytes / 2**20:.0f} MiB of "
                   f"{b['cpu'].capacity_bytes / 2**20:.0f}")


def _prepare_offload(llm, prompt_ids, max_new_tokens) -> None:
    """Plan (or load) the policy, build the offload engine and print the policy before the run."""
    from offload import BudgetExceededError
    from placement import InfeasiblePlanError

    mean_len = sum(map(len, prompt_ids)) // len(prompt_ids)
    try:
        llm.prepare(prompt_len=mean_len, gen_len=max_new_tokens, num_sequences=len(prompt_ids),
                    on_profile=lambda p: click.echo(f"measuring this machine once (cached in {p}) ...", err=True))
    except (InfeasiblePlanError, BudgetExceededError, OSError, ValueError) as e:
        raise click.ClickException(str(e))
    p = llm.policy
    split = lambda t: f"gpu {t.gpu:.0%} / cpu {t.cpu:.0%} / disk {t.disk:.0%}"  # noqa: E731
    click.echo(f"policy: block {p.gpu_batch_size} x {p.num_gpu_batches} | weights {split(p.weights)} | "
               f"cache {split(p.cache)} | activations {split(p.activations)} | compress weight {p.compress_weight}, "
               f"cache {p.compress_cache} | cpu attention {p.cpu_attention} | decode merged {p.merge_decode}")
    if llm.plan is not None:
        click.echo(f"predicted {llm.plan.tokens_per_s:.2f} tok/s (planner, prompt {mean_len}, gen {max_new_tokens})")
    if llm.executor.reused_disk:
        click.echo("offload folder reused")
