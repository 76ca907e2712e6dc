"""Options shared by the commands that load a model."""

import click


def _set_threads(ctx, param, value):
    if value:
        import torch

        torch.set_num_threads(value)
    return value


def model_options(fn):
    fn = click.option("--threads", type=click.IntRange(min=1), default=None, expose_value=False,
                      callback=_set_threads,
                      help="CPU threads for compute. On a shared, busy machine 1 can be far faster than the "
                           "default (torch's: all cores), since threads then wait on each other.")(fn)
    fn = click.option("--dtype", default="float32", show_default=True,
                      type=click.Choice(["float32", "bfloat16", "float16"]),
                      help="Weight and compute dtype.")(fn)
    fn = click.option("--model", default="smollm2-135m", show_default=True,
                      help="Built-in name (smollm2-135m), a Hugging Face folder, or a .gguf file. Nothing is downloaded.")(fn)
    return fn
