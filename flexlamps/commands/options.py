"""Options shared by the commands that compute: model, dtype, threads, offloading; byte sizes;
peak RSS; the checks of paths a command reads or writes, made before any model loads."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import click

from flexlamps.cores import free_cores
from flexlamps.settings import RunSettings
from offload.folders import UnusablePathError, make_writable_folder
from offload.lock import PathInUseError, PathLock
from placement import parse_bytes


class ByteSize(click.ParamType):
    """A positive size such as 2GiB, 512MiB or 16GB (`placement.parse_bytes`, the one size
    parser); with `zero_ok`, 0 too (an option where 0 turns something off)."""

    name = "size"

    def __init__(self, zero_ok: bool = False):
        self.zero_ok = zero_ok

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value

        if self.zero_ok and str(value).strip().lower() in ("0", "0b"):
            return 0
        try:
            return parse_bytes(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def refused_option(name: str, message: str):
    """An option a command no longer takes: given, it stops the command with `message` (one line)."""
    def refuse(ctx, param, value):
        if value is not None:
            raise click.UsageError(f"{name}: {message}")

    return click.option(name, hidden=True, expose_value=False, callback=refuse, is_eager=True)


def writable_folder(path, option: str):
    """`path` made (with parents) and checked writable, or a one-line error naming `option` and
    the fix: the check every command makes of its output folder before any model loads."""
    try:
        return make_writable_folder(path, option)
    except UnusablePathError as e:
        raise click.ClickException(str(e)) from None


def writable_file_folder(path, option: str):
    """The folder an output file goes in, made and checked writable (see `writable_folder`)."""
    path = Path(path)
    try:
        return make_writable_folder(path.parent if str(path.parent) else Path("."), option, shown=path)
    except UnusablePathError as e:
        raise click.ClickException(str(e)) from None


def hold_output(path, option: str) -> None:
    """`path`, a file or folder this command writes, locked until the command ends (on its target
    where `path` is a symlink: two names of one folder are one output), or a one-line error naming
    the run that holds it: the check `generate` makes of --out, for the commands that write folders."""
    try:
        lock = PathLock(Path(path).resolve(), option, shown=path).acquire()
    except (PathInUseError, UnusablePathError) as e:
        raise click.ClickException(str(e)) from None
    click.get_current_context().call_on_close(lock.release)


def plots_wanted(no_plots: bool) -> bool:
    """Whether to draw the PNG plots: not with --no-plots, nor where matplotlib (the `plots` extra)
    is not installed: a note says so before the run, whose result is its summary.json."""
    if no_plots:
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        click.echo("note: no PNG plots: matplotlib is not installed (pip install 'flexlamps[plots]'); "
                   "summary.json is written", err=True)
        return False
    return True


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def set_threads(value: int | None) -> int:
    """Use `value` compute threads; when None, $OMP_NUM_THREADS if the user set it, else the
    free cores. Returns the count set."""
    import torch

    env = os.environ.get("OMP_NUM_THREADS", "")
    threads = value or (int(env) if env.isdigit() and int(env) > 0 else free_cores())
    torch.set_num_threads(threads)
    return threads


def _set_threads(ctx, param, value):
    ctx.meta["flexlamps.threads"] = value  # read back by commands that start workers (--ray)
    set_threads(value)
    return value


def threads_option(fn):
    return click.option("--threads", type=click.IntRange(min=1), default=None, expose_value=False,
                        callback=_set_threads,
                        help="CPU threads for compute. [default: $OMP_NUM_THREADS, else the cores not busy "
                             "with other processes, from the load average; torch's own default of every core "
                             "can run many times slower on a busy machine]")(fn)


def model_options(fn):
    fn = threads_option(fn)
    fn = click.option("--dtype", default="auto", show_default=True,
                      type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
                      help="Weight and compute dtype. auto: bfloat16 with the blocks of a quantized GGUF (Q4_0, "
                           "Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q8_0) computed in place (perplexity within 1% of float32), "
                           "else float32.")(fn)
    fn = click.option("--model", default="smollm2-135m", show_default=True,
                      help="Built-in name (smollm2-135m), a Hugging Face folder, or a .gguf file. Nothing is downloaded.")(fn)
    return fn


def ray_options(fn):
    """`--ray [ADDRESS]` and `--ray-workers`, for the commands that scale out (flexlamps.distributed)."""
    fn = click.option("--ray-workers", type=click.IntRange(min=1), default=None,
                      help="Engine workers with --ray. [default: one per GPU of the cluster, else one per "
                           "CPU (per --threads CPUs)]")(fn)
    fn = click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
                      help="Run on a Ray cluster, one engine per GPU or CPU slot (pip install 'flexlamps[ray]'). "
                           "ADDRESS: HOST:PORT or ray://HOST:PORT of a running cluster, auto (one started here "
                           "with `ray start`), or nothing: $RAY_ADDRESS, else a private cluster on this machine.")(fn)
    return fn


def offload_options(fn):
    """Placement and compression: --gpu-mem, --cpu-mem, --offload-dir, --placement, --compress-weight,
    --compress-cache, --weight-quant (any of them turns on the offload engine: RunSettings.offloaded)."""
    options = [
        click.option("--gpu-mem", default=None, type=ByteSize(),
                     help="GPU tier budget (e.g. 2GiB); turns on the offload engine. Without a GPU the gpu tier is "
                          "CPU memory, its budget still enforced. [default: off, all in memory]"),
        click.option("--cpu-mem", default=None, type=ByteSize(), help="CPU tier budget for offloaded weights and cache (e.g. 8GiB). "
                     "[default with --gpu-mem: half the available RAM]"),
        click.option("--offload-dir", default=None, type=click.Path(file_okay=False),
                     help="Folder for the disk tier: flexlamps works in a subfolder flexlamps-offload/ it creates "
                          "there, reused across runs when still valid; nothing else in the folder is touched. "
                          "[default: offload/ in the cache folder, ~/.cache/flexlamps]"),
        click.option("--placement", "--policy", "policy_arg", default="auto", show_default=True,
                     help="Weight, cache and activation placement with --gpu-mem: 'auto' (the planner, with this "
                          "machine's cached profile) or a policy JSON file from `flexlamps plan`. --policy is "
                          "FlexGen's name for it."),
        click.option("--compress-weight", is_flag=True, default=None, help="Store weights 4-bit group-wise on every tier."),
        click.option("--compress-cache", is_flag=True, default=None, help="Store the KV cache 4-bit group-wise."),
        click.option("--weight-quant", type=click.Choice(["groupwise4", "groupwise8", "nf4", "fp4", "none"]),
                     default=None, help="Weight compression backend (nf4/fp4 need a bitsandbytes that runs here). "
                                        "[default: groupwise4 with --compress-weight, else none]"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


# the RunSettings fields that offload_options set
OFFLOAD_SETTINGS = ("gpu_mem", "cpu_mem", "offload_dir", "policy", "compress_weight", "compress_cache", "weight_quant")


def engine_settings(model, dtype, gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache,
                    weight_quant, **more) -> RunSettings:
    """The model_options and offload_options parsed into the one RunSettings (`more`: other of its
    fields, e.g. max_batch_size); a bad value is a UsageError naming it."""
    return engine_settings_from(model, dtype, dict(
        gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=offload_dir, policy=policy_arg, compress_weight=compress_weight,
        compress_cache=compress_cache, weight_quant=weight_quant, **more))


def engine_settings_from(model, dtype, fields: dict) -> RunSettings:
    """RunSettings from LLM(...)'s keyword arguments; a bad value is a UsageError naming it."""
    try:
        return RunSettings.parse(model, dtype=dtype, **fields)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def check_model(model: str, chat: bool = False) -> None:
    """What --model names opens (a built-in name, an HF folder, a .gguf file: its config, tensor
    index and every safetensors header, and a folder's tokenizer files; no weights), and with
    `chat` its chat template renders a user turn; else a one-line error naming the input and the fix."""
    from flexlamps.api import open_checkpoint  # lazy (torch): `plan` and `simulate` share these options

    try:
        reader = open_checkpoint(model)  # no description built: the run builds its one
        if Path(reader.path).is_dir() or chat:  # a folder's files the user gave (a GGUF's are its own)
            tokenizer = reader.tokenizer
    except (ValueError, OSError) as e:  # UnknownModelError, CheckpointError, UnsupportedModelError
        raise click.ClickException(str(e)) from None
    if chat and tokenizer.chat_template:  # no template at all: each prompt is told so, as before
        import jinja2

        try:
            tokenizer.apply_chat_template([{"role": "user", "content": "hello"}])
        except jinja2.TemplateError as e:
            raise click.ClickException(f"--model {model}: its chat template does not render a user turn "
                                       f"({type(e).__name__}: {e}); fix the template or leave out --chat") from None


def check_policy(policy) -> None:
    """A --placement file read and checked before any model loads ("auto" plans later)."""
    if isinstance(policy, str) and policy != "auto":
        from flexlamps.api import load_policy  # lazy (torch): as check_model

        try:
            load_policy(policy)
        except ValueError as e:
            raise click.ClickException(str(e)) from None


def check_offload_dir(path: str | None) -> None:
    """--offload-dir made and writable before any model loads (the engine makes its subfolder there)."""
    if path is not None:
        writable_folder(path, "--offload-dir")


def offload_kwargs(run: RunSettings) -> dict:
    """`run`'s offload settings as LLM(...) keyword arguments (for engines built elsewhere, e.g. Ray workers)."""
    return {name: getattr(run, name) for name in OFFLOAD_SETTINGS}
