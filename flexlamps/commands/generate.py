"""`flexlamps generate`: JSONL (or text) prompts in, one JSONL record per prompt out, resumable.
An OpenAI Batch file in gives OpenAI batch output lines out (`flexlamps.io.openai_batch`).

Everything a user can get wrong is checked before the model loads: option ranges, sizes, paths,
the policy file, the prompt file, and whether `--out` holds another job's records (or is in use).
"""

from __future__ import annotations

import sys
import time

import click

from flexlamps import fault_points
from flexlamps.api import ContextOverflowError, JsonGrammars, NonFiniteLogitsError, open_model
from flexlamps.commands.memory import check_max_rss, fill_cap
from flexlamps.commands.options import (ByteSize, check_model, check_offload_dir, check_policy, engine_settings, model_options,
                                        offload_options, peak_rss_mib, ray_options)
from flexlamps.distributed.cluster import DistributedError, ray_cluster
from flexlamps.distributed.generate import generate_on_ray
from flexlamps.generate_job import (
    GenerateSettings,
    encode_or_error_rows,
    error_message,
    generate_rows,
    pending_job,
    prepare_offload,
)
from flexlamps.io.prompts import PromptFileError
from flexlamps.io.records import canonical_schema
from flexlamps.io.results import ResultsError
from offload import BudgetExceededError, PathInUseError, compute_device
from placement import InfeasiblePlanError


def _since_process_start() -> float:
    """Seconds since this process started. On Linux from the kernel's own clocks (the process's
    start in clock ticks since boot, and the time since boot): psutil adds that start to the boot
    time in whole seconds, which overstates the result by up to a second (0.4 s on the dev VM)."""
    import os

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces; fields after it
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, IndexError, ValueError):  # not Linux
        import psutil

        return time.time() - psutil.Process().create_time()


@click.command("generate")
@model_options
@click.option("--prompts", "prompts_path", required=True, type=click.Path(dir_okay=False),
              help='Input: JSONL lines {"id": ..., "prompt": ...} or {"id": ..., "messages": [...]} (optional '
                   '"json_schema" and "n" samples; extra fields are kept), an OpenAI Batch file (custom_id, url, '
                   'body), or a text file, one prompt a line.')
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="Output JSONL, one record per prompt. Re-running the same command resumes: finished records whose "
                   "fingerprint (model file, options, prompt) matches are kept.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1),
              help="Tokens to generate per prompt at most.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Sampling temperature; 0 is greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(min=0.0, max=1.0, min_open=True),
              help="Nucleus sampling: keep the smallest set of tokens with this much probability.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0),
              help="Sample among the k most likely tokens; 0 keeps all.")
@click.option("--seed", default=0, show_default=True, help="Sampling seed; each prompt's seed derives from it and the prompt id, so results do not depend on batching or resuming.")
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--logprobs", is_flag=True, help="Record the log-probability of each generated token.")
@click.option("--chat", is_flag=True, help="Wrap each prompt as a user turn in the model's chat template (instruct models).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the end-of-sequence token.")
@click.option("--json-schema", "json_schema_path", default=None, type=click.Path(dir_okay=False),
              help="A JSON schema file every answer must follow (enforced while decoding), for lines that give "
                   "none of their own (a json_schema field, or an OpenAI body's response_format).")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(min=1),
              help="Sequences decoded together (continuous batching).")
@offload_options
@click.option("--max-rss", default=None, type=ByteSize(),
              help="Refuse to start when the run's planned memory (fixed overhead plus weights, cache or tier "
                   "budgets) exceeds this size. With --gpu-mem and no --cpu-mem, the cpu tier is what this "
                   "leaves (printed), so the run holds as much of the model as the cap allows.")
@click.option("--overwrite", is_flag=True,
              help="Recompute records of --out made from other inputs (model file, options, prompt text) instead "
                   "of refusing; matching records are kept.")
@click.option("--strict", is_flag=True, help="Refuse the whole job when a line cannot run (longer than the model's "
              "context, a bad OpenAI body, a schema that cannot be compiled) instead of recording it as an error "
              "(finish_reason \"error\", or an OpenAI error line) and running the others.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@ray_options
def command(model, dtype, prompts_path, out_path, max_new_tokens, temperature, top_p, top_k, seed, stop,
            logprobs, chat, ignore_eos, json_schema_path, batch_size, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight,
            compress_cache, weight_quant, max_rss, overwrite, strict, no_progress, ray_address, ray_workers):
    """Generate a completion for every prompt in PROMPTS and write them to OUT."""
    check_model(model, chat=chat)
    run = engine_settings(model, dtype, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache,
                          weight_quant, max_batch_size=batch_size)
    if max_rss is not None:
        run = _cpu_tier_within(run, max_rss)
    settings = GenerateSettings(
        run=run, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        stop=tuple(stop), logprobs=logprobs, ignore_eos=ignore_eos, chat=chat,
        json_schema=_read_schema(json_schema_path), created=_modified_s(prompts_path))
    try:
        settings.sampling_params("")  # bad sampling flags fail here, before any model loads
    except ValueError as e:
        raise click.UsageError(str(e))
    job = _pending_job(settings, prompts_path, out_path, overwrite)
    fault_points.reached("job_locked")
    try:
        _run(settings, job, no_progress, max_rss, strict, ray_address, ray_workers)
    finally:
        job.results.release()


def _cpu_tier_within(run, max_rss: int):
    """With --max-rss and --gpu-mem but no --cpu-mem: the cpu tier is what the cap leaves, said on stderr."""
    run, line = fill_cap(run, max_rss, gpu_is_host=compute_device().type == "cpu")
    if line is not None:
        click.echo(line, err=True)
    return run


def _read_schema(path: str | None) -> str | None:
    """--json-schema's schema as canonical text, or a usage error naming the file and the fix."""
    import json

    if path is None:
        return None
    try:
        schema = json.loads(open(path, encoding="utf-8").read())
    except OSError as e:
        raise click.UsageError(f"--json-schema {path} cannot be read ({e.strerror}); check the path")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise click.UsageError(f"--json-schema {path} is not JSON ({e}); give a JSON schema object")
    if not isinstance(schema, dict):
        raise click.UsageError(f"--json-schema {path} must hold a JSON schema object, not {type(schema).__name__}")
    return canonical_schema(schema)


def _modified_s(path: str) -> int:
    """The prompt file's modification time in whole seconds (0 when it is missing: reading it says so)."""
    import os

    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def _pending_job(settings, prompts_path, out_path, overwrite):
    """Check the policy file and the offload folder, read the prompts, lock --out and load what
    earlier runs finished; every refusal names the input and the fix."""
    try:
        check_policy(settings.run.policy)
        check_offload_dir(settings.run.offload_dir)
        job = pending_job(settings, prompts_path, out_path, overwrite)
    except (PromptFileError, ResultsError, PathInUseError, ValueError) as e:
        raise click.ClickException(str(e))
    if (why := job.results.state.describe()) is not None:
        click.echo(why, err=True)
    _note_models(job.records, settings.model_name)
    return job


def _note_models(records, loaded: str) -> None:
    """OpenAI bodies name a model; the loaded one answers them all (said once, not an error)."""
    named = {r.model for r in records if r.model is not None and r.model != loaded}
    if named:
        click.echo(f"note: lines name model(s) {', '.join(sorted(named)[:3])}; {loaded} (--model) answers every "
                   "line and is the \"model\" of each response", err=True)


def _run(settings, job, no_progress, max_rss, strict, ray_address, ray_workers) -> None:
    if not job.todo:
        job.results.open()
        job.results.finalize(job.order)
        click.echo(f"all {len(job.records)} prompts already done in {job.results.out}")
        return
    try:
        if ray_address is None:
            _run_local(settings, job, no_progress, strict, max_rss)
        else:
            if max_rss is not None:
                _check_max_rss(settings, max_rss, len(job.todo), None)
            threads = click.get_current_context().meta.get("flexlamps.threads") or 1
            _run_on_ray(settings, job, no_progress, ray_address, ray_workers, threads, strict)
    except (ResultsError, PathInUseError) as e:
        raise click.ClickException(str(e))


class _Progress:
    """The progress bar with the running tokens/s, and the totals for the summary line."""

    def __init__(self, total: int, disable: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="prompt", disable=disable, file=sys.stderr, dynamic_ncols=True)
        self.t0 = time.perf_counter()
        self.generated = 0
        self.first_token_s = None  # from process start (imports and model load included)

    def tokens(self, n: int) -> None:
        if self.first_token_s is None:
            self.first_token_s = _since_process_start()
        self.generated += n
        self.bar.set_postfix_str(f"{self.generated / max(time.perf_counter() - self.t0, 1e-9):.1f} tok/s",
                                 refresh=False)

    def prompts(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> float:
        self.bar.close()
        return time.perf_counter() - self.t0


def _open_results(job, out_path) -> None:
    try:
        job.results.open()
    except (OSError, ResultsError) as e:
        raise click.ClickException(f"cannot write {out_path}: {e}")


def _interrupted(job, progress: _Progress) -> None:
    job.results.close()
    progress.close()
    click.echo(f"\ninterrupted: {len(job.results.done)} of {len(job.records)} done; re-run the same command to "
               "resume", err=True)
    sys.exit(130)


def _finish(job, progress: _Progress, wall: float) -> None:
    job.results.finalize(job.order)
    skipped = len(job.records) - len(job.todo)
    click.echo(f"prompts {len(job.todo)} (+{skipped} done before) | generated tokens {progress.generated} | "
               f"wall {wall:.1f} s | {progress.generated / wall:.1f} tok/s | first token "
               f"{progress.first_token_s or 0:.2f} s after process start | peak RSS {peak_rss_mib():.0f} MiB")


def _check_max_rss(settings, max_rss: int, num_prompts: int, llm) -> None:
    """--max-rss against the run's one description: the local engine's (its weights not read yet),
    or on Ray one opened here (the driver holds no engine)."""
    if llm is None:
        reader, spec = open_model(settings.run.model, settings.run.cache_dir or None)
        check_max_rss(settings, max_rss, num_prompts, reader, spec)
    else:
        check_max_rss(settings, max_rss, num_prompts, llm.reader, llm.model_spec)


def _run_local(settings, job, no_progress: bool, strict: bool, max_rss: int | None) -> None:
    """One engine in this process (with --max-rss, checked before any weight is read)."""
    llm = _load_engine(settings, prepare=False)
    try:
        if max_rss is not None:
            _check_max_rss(settings, max_rss, len(job.todo), llm)
        _load_weights(llm)
        if not settings.chat and llm.tokenizer.chat_template and any(r.prompt and not r.endpoint for r in job.todo):
            click.echo("hint: this model has a chat template; an instruct model given plain prompts often answers "
                       "with empty or odd text. Add --chat to wrap each prompt as a user turn.", err=True)
        _open_results(job, job.results.out)
        todo, prompt_ids = _encode(llm.tokenizer, llm.config.max_position, job, settings, strict, llm.grammars)
        if todo and settings.run.offloaded:
            _prepare_offload(llm, prompt_ids, settings, todo)
        progress = _Progress(len(todo), no_progress)

        def on_row(row: dict) -> None:
            job.results.add(row)
            progress.prompts(1)

        try:
            if todo:
                generate_rows(llm, settings, todo, prompt_ids, on_row, on_tokens=progress.tokens)
        except KeyboardInterrupt:
            _interrupted(job, progress)
        except ContextOverflowError as e:
            raise click.ClickException(str(e))
        except NonFiniteLogitsError as e:
            raise click.ClickException(f"--model {settings.run.model}: {e}") from None
        wall = progress.close()
        _finish(job, progress, wall)
    finally:
        llm.close()  # releases the offload folder's lock even when the run fails
    if settings.run.offloaded and todo:
        b = llm.executor.budgets
        click.echo(f"measured {progress.generated / wall:.2f} tok/s | peak gpu tier {b['gpu'].peak_bytes / 2**20:.0f} "
                   f"MiB of {b['gpu'].capacity_bytes / 2**20:.0f} | peak cpu tier {b['cpu'].peak_bytes / 2**20:.0f} "
                   f"MiB of {b['cpu'].capacity_bytes / 2**20:.0f} | peak RSS {peak_rss_mib():.0f} MiB (whole process)")


def _encode(tokenizer, max_position, job, settings, strict, grammars):
    """Token ids of the prompts to run; the others are recorded as errors with why (finish_reason
    "error", or an OpenAI error line; with --strict: the job is refused before anything runs)."""
    todo, prompt_ids, errors = encode_or_error_rows(tokenizer, max_position, job.todo, settings.chat, grammars,
                                                    settings.json_schema)
    if errors:
        first = errors[0].get("custom_id") or errors[0]["id"]
        if strict:
            raise click.ClickException(f"prompt id {first!r}: {error_message(errors[0])} ({len(errors)} such "
                                       "prompts); fix them or drop them from the file, or leave out --strict to "
                                       "record them as errors")
        click.echo(f"{len(errors)} prompts cannot run (e.g. id {first!r}: {error_message(errors[0])}); recorded "
                   "as errors", err=True)
    for row in errors:
        job.results.add(row)
    return todo, prompt_ids


_LOAD_ERRORS = (ValueError, OSError, MemoryError)  # MemoryError: a tier budget that cannot hold the model


def _load_engine(settings, prepare: bool = True):
    """The run's LLM (an unknown or unsupported model and a damaged checkpoint are ValueErrors)."""
    try:
        return settings.load_llm(prepare)
    except _LOAD_ERRORS as e:
        raise click.ClickException(str(e))


def _load_weights(llm) -> None:
    try:
        llm.load()
    except _LOAD_ERRORS as e:
        raise click.ClickException(str(e))


def _prepare_offload(llm, prompt_ids, settings, records) -> None:
    """Plan (or load) the policy, build the offload engine and print the policy before the run."""
    try:
        lines = prepare_offload(llm, prompt_ids, settings, on_profile=lambda p, why: click.echo(
            f"measuring this machine ({why}; cached in {p}) ...", err=True), records=records)
    except (InfeasiblePlanError, BudgetExceededError, OSError, ValueError) as e:
        raise click.ClickException(str(e))
    for line in lines:
        click.echo(line)


def _run_on_ray(settings, job, no_progress: bool, address: str, num_workers, threads: int, strict: bool) -> None:
    """One engine per Ray worker; this process only reads prompts and writes the results."""
    _open_results(job, job.results.out)
    todo, prompt_ids = _encode_on_driver(settings, job, strict)
    progress = None
    t0 = time.perf_counter()
    try:
        with ray_cluster(address or None, num_workers, threads) as slots:
            def on_workers(infos):  # the clock of the tokens/s starts here, as it does after a local load
                nonlocal progress
                click.echo(f"ray: {len(infos)} workers x {threads} threads ({'GPU' if slots.on_gpu else 'CPU'}) "
                           f"on {', '.join(sorted({i['host'] for i in infos}))}, started in "
                           f"{time.perf_counter() - t0:.1f} s")
                for info in infos:
                    for line in info["lines"]:
                        click.echo(f"worker {info['rank']}: {line}")
                progress = _Progress(len(todo), no_progress)

            def on_rows(rows, tokens):
                for row in rows:
                    job.results.add(row)
                progress.prompts(len(rows))
                progress.tokens(tokens)

            if todo:  # prompts that cannot run were recorded as errors already
                generate_on_ray(settings, threads, slots, todo, prompt_ids, on_rows, on_workers)
    except KeyboardInterrupt:
        _interrupted(job, progress or _Progress(0, True))
    except DistributedError as e:
        job.results.close()
        raise click.ClickException(str(e))
    except (ValueError, OSError, MemoryError) as e:  # a worker's engine: bad budget, policy, prompt
        job.results.close()
        raise click.ClickException(f"a worker failed: {e}")
    progress = progress or _Progress(0, True)  # nothing ran: every prompt was an error
    _finish(job, progress, progress.close())


def _encode_on_driver(settings, job, strict: bool):
    """Check the model and every prompt's length here, before any cluster starts."""
    try:
        reader, _ = open_model(settings.run.model)
    except (ValueError, OSError) as e:  # an unknown or unsupported model, a damaged checkpoint
        raise click.ClickException(str(e))

    return _encode(reader.tokenizer, reader.config.max_position, job, settings, strict,
                   JsonGrammars(reader.tokenizer, reader.config.vocab_size))
