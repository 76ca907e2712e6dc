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


def offload_options(fn):
    """Placement and compression: --gpu-mem, --cpu-mem, --offload-dir, --policy, --compress-weight,
    --compress-cache, --weight-quant (any of them turns on the offload engine; see engine_settings)."""
    options = [
        click.option("--gpu-mem", default=None,
                     help="GPU tier budget (e.g. 2GiB); turns on the offload engine. Without a GPU the gpu tier is "
                          "CPU memory, its budget still enforced. [default: off, all in memory]"),
        click.option("--cpu-mem", default=None, help="CPU tier budget for offloaded weights and cache (e.g. 8GiB). "
                     "[default with --gpu-mem: half the available RAM]"),
        click.option("--offload-dir", default=None, type=click.Path(file_okay=False),
                     help="Folder for the disk tier; reused across runs when still valid, rebuilt when stale or damaged."),
        click.option("--policy", "policy_arg", default="auto", show_default=True,
                     help="Placement with --gpu-mem: 'auto' (the planner, with this machine's cached profile) or a "
                          "policy JSON file."),
        click.option("--compress-weight", is_flag=True, default=None, help="Store weights 4-bit group-wise on every tier."),
        click.option("--compress-cache", is_flag=True, default=None, help="Store the KV cache 4-bit group-wise."),
        click.option("--weight-quant", type=click.Choice(["groupwise4", "groupwise8", "nf4", "fp4", "none"]),
                     default=None, help="Weight compression backend (nf4/fp4 need a bitsandbytes that runs here). "
                                        "[default: groupwise4 with --compress-weight, else none]"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def engine_settings(gpu_mem, cpu_mem, offload_dir, policy_arg, compress_weight, compress_cache,
                    weight_quant) -> tuple[dict, bool]:
    """(LLM(...) keyword arguments, whether the offload engine runs) from the offload_options."""
    if weight_quant and weight_quant != "none":
        compress_weight = True
    offload = any(v is not None for v in (gpu_mem, cpu_mem, offload_dir)) or bool(compress_weight or compress_cache)
    kwargs = dict(gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=offload_dir, policy=policy_arg,
                  compress_weight=compress_weight, compress_cache=compress_cache, weight_quant=weight_quant)
    return kwargs, offload
