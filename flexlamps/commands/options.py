"""Options shared by the commands that load a model."""

import click


def _set_threads(ctx, param, value):
    ctx.meta["flexlamps.threads"] = value  # read back by commands that start workers (--ray)
    if value:
        import torch

        torch.set_num_threads(value)
    return value


def model_options(fn):
    fn = click.option("--threads", type=click.IntRange(min=1), default=None, expose_value=False,
                      callback=_set_threads,
                      help="CPU threads for compute. On a shared, busy machine 1 can be far faster than the "
                           "default (torch's: all cores), since threads then wait on each other.")(fn)
    fn = click.option("--dtype", default="auto", show_default=True,
                      type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
                      help="Weight and compute dtype. auto: bfloat16 with 4-bit weights computed in place for a "
                           "GGUF with 4-bit blocks (perplexity within 1% of float32), else float32.")(fn)
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
