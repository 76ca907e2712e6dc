"""Options shared by the commands that load a model."""

import click


def model_options(fn):
    fn = click.option("--dtype", default="float32", show_default=True,
                      type=click.Choice(["float32", "bfloat16", "float16"]),
                      help="Weight and compute dtype.")(fn)
    fn = click.option("--model", default="smollm2-135m", show_default=True,
                      help="Built-in name (smollm2-135m), a Hugging Face folder, or a .gguf file. Nothing is downloaded.")(fn)
    return fn
