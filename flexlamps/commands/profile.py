"""`flexlamps profile`: measure this machine and write a HardwareSpec JSON for `flexlamps plan`."""

from pathlib import Path

import click

from flexlamps.api import open_checkpoint
from flexlamps.commands.options import ByteSize, threads_option, writable_file_folder, writable_folder
from flexlamps.commands.plan import load_model_spec
from flexlamps.io.atomic import atomic_output
from flexlamps.profiling import PROBE_NAMES, latent_miss_curves, profile_machine, profile_routing
from placement import format_bytes


def write_atomically(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + rename, so no half-written file is left."""
    with atomic_output(path, fsync=True) as handle:
        handle.write(text)


@click.command("profile")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the HardwareSpec JSON, e.g. hw.json (needed unless --prompts is given).")
@click.option("--quick", is_flag=True,
              help="Small probes with bounded sweeps: about 15-20 s on a quiet CPU (more for MoE), rougher numbers.")
@click.option("--disk-dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Folder to measure disk speed in (your offload folder). Default: --out's.")
@click.option("--gpu-mem", type=ByteSize(), help="GPU memory to plan with, e.g. 8GiB. Default: the device's; "
              "on a CPU-only box a quarter of RAM.")
@click.option("--model", "model_text", help="Time GEMMs and 4-bit decompression on this model's own "
              "layer matrices (config.json, HF folder or preset; as `plan --model`). Small models run "
              "well below a large matrix's rate on CPUs. Default: a generic 2048x1024 matrix. For a "
              "sparse-attention MLA model's HF folder, also measure its latent pools' miss curves "
              "(a short decode) for the planner.")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A MoE model's routing on your prompts (one a line): run them with --model (an HF folder "
              "or GGUF), count how often each layer's experts are picked and cache the counts; the engine "
              "then puts the hottest experts on the fastest tier.")
@threads_option
def command(out_path: Path | None, quick: bool, disk_dir: Path | None, gpu_mem: int | None, model_text: str | None,
            prompts_path: Path | None):
    """Measure disk, copy, GEMM, CPU-attention and dequantization speeds of this machine (and,
    with --prompts, a MoE model's routing)."""
    if prompts_path is not None:
        reader, prompts = _routing_inputs(model_text, prompts_path)
        if out_path is None:
            return _profile_routing(reader, prompts)
    elif out_path is None:
        raise click.UsageError("give --out (where to write the hardware profile) or --model with --prompts")
    _profile_hardware(out_path, quick, disk_dir, gpu_mem, model_text)
    if prompts_path is not None:
        _profile_routing(reader, prompts)


def _routing_inputs(model_text: str | None, prompts_path: Path):
    """The MoE checkpoint and the prompts' token ids, checked before anything is measured."""
    if model_text is None:
        raise click.BadParameter("a routing profile needs the model: add --model (an HF folder or GGUF)",
                                 param_hint="--prompts")
    try:
        reader = open_checkpoint(model_text)
    except (ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from None
    if reader.config.moe is None:
        raise click.BadParameter(f"{model_text} has no routed experts: --prompts profiles a MoE model's routing",
                                 param_hint="--prompts")
    try:
        lines = [line.strip() for line in prompts_path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {prompts_path}: {exc}", param_hint="--prompts") from None
    if not lines:
        raise click.BadParameter(f"{prompts_path} holds no prompts (one a line)", param_hint="--prompts")
    return reader, [reader.tokenizer.encode(line) for line in lines]


ROUTING_NEW_TOKENS = 16  # greedy tokens generated per prompt: decode's routing is counted too


def _profile_routing(reader, prompts) -> None:
    profile, path = profile_routing(reader, prompts, ROUTING_NEW_TOKENS)
    top = max(max(row) for row in profile.counts.values()) / profile.tokens if profile.tokens else 0.0
    click.echo(f"wrote {path}\n  routing of {profile.tokens} tokens over {len(profile.counts)} MoE layers; "
               f"the hottest expert is picked by {top:.0%} of tokens (uniform: "
               f"{profile.experts_per_token / profile.num_experts:.0%})")


def _profile_hardware(out_path: Path, quick: bool, disk_dir: Path | None, gpu_mem: int | None,
                      model_text: str | None) -> None:
    from tqdm import tqdm

    if not out_path.parent.exists():
        raise click.BadParameter(f"folder {out_path.parent} does not exist", param_hint="--out")
    writable_file_folder(out_path, "--out")
    if disk_dir is not None:
        writable_folder(disk_dir, "--disk-dir")  # the disk probe writes there
    out_path = out_path.resolve()
    model = None
    if model_text is not None:
        model = load_model_spec(model_text)
    gpu_budget = gpu_mem  # bytes (ByteSize) or None
    with tqdm(total=len(PROBE_NAMES), desc="profiling", unit="probe") as bar:
        def step(name: str) -> None:
            if bar.n or name != PROBE_NAMES[0]:
                bar.update(1)
            bar.set_postfix_str(name)

        spec = profile_machine(disk_folder=disk_dir or out_path.parent, quick=quick,
                               gpu_budget_bytes=gpu_budget, step=step,
                               model_shapes=model.layer_matrix_shapes() if model else None,
                               expert_dims=model.routed_expert_dims() if model else None)
        bar.update(bar.total - bar.n)
    curves_line = ""
    if model is not None and model.index_topk:
        spec, curves_line = _with_latent_miss_curves(spec, model, model_text)
    write_atomically(out_path, spec.to_json() + "\n")
    gb = 1e9
    click.echo(
        f"wrote {out_path}\n"
        f"  disk read {spec.disk_read_bytes_per_s / gb:.2f} GB/s, "
        f"write {spec.disk_write_bytes_per_s / gb:.2f} GB/s\n"
        f"  cpu->gpu {spec.cpu_to_gpu_bytes_per_s / gb:.2f} GB/s, "
        f"gpu->cpu {spec.gpu_to_cpu_bytes_per_s / gb:.2f} GB/s, "
        f"gpu memory {spec.gpu_mem_bytes_per_s / gb:.1f} GB/s, "
        f"per-layer overhead {spec.gpu_layer_overhead_s * 1e6:.0f} us\n"
        "  gemm " + ", ".join(f"{k} {v / 1e12:.3f} TFLOP/s"
                              for k, v in spec.gpu_matmul_flops_per_s.items()) + "\n"
        f"  cpu attention {spec.cpu_attention_flops_per_s / 1e9:.1f} GFLOP/s, "
        f"dequant {spec.gpu_dequant_bytes_per_s / gb:.2f} GB/s + {spec.gpu_dequant_matrix_s * 1e6:.0f} us a matrix"
        + "".join(f", delta rule {k} {v / 1e9:.1f} GFLOP/s" for k, v in spec.gpu_delta_rule_flops_per_s.items())
        + "\n"
        f"  4-bit weights: fused kernel under {spec.int4_dense_from_rows} rows "
        + ", ".join(f"{k} {max(v.values()) / 1e9:.0f} GFLOP/s" for k, v in spec.gpu_int4_gemm_flops_by_rows.items())
        + f"; dequantized above at {spec.gpu_int4_dequant_bytes_per_s / gb:.2f} GB/s"
        + "".join(f", prompts on int8 codes {k} {max(v.values()) / 1e9:.0f} GFLOP/s"
                  for k, v in spec.gpu_int8_prompt_flops_by_rows.items()) + "\n"
        + _expert_line(spec) +
        f"  gpu {format_bytes(spec.gpu_mem_bytes)}, cpu {format_bytes(spec.cpu_mem_bytes)}, "
        f"disk {format_bytes(spec.disk_bytes)}" + curves_line)


def _expert_line(spec) -> str:
    """The MoE experts' rates (GFLOP/s at the fewest and most tokens an expert measured), or ""."""
    def span(table: dict) -> str:
        rows = sorted(table, key=int)
        return f"{table[rows[0]] / 1e9:.1f}-{table[rows[-1]] / 1e9:.1f} GFLOP/s at {rows[0]}-{rows[-1]} tokens"

    parts = [f"{phase} {'4-bit ' if int4 else ''}{dtype} {span(table)}"
             for int4, tables in ((False, spec.gpu_expert_flops_by_rows), (True, spec.gpu_int4_expert_flops_by_rows))
             for phase, by_dtype in tables.items() for dtype, table in by_dtype.items()]
    return "  moe experts: " + ", ".join(parts) + "\n" if parts else ""


def _with_latent_miss_curves(spec, model, model_text: str):
    """The profile with the latent pools' miss curves measured on the model (a sparse-attention
    MLA model's HF folder, small enough to run in memory), and the line that reports them."""
    import dataclasses

    import psutil

    folder = Path(model_text)
    if not (folder.is_dir() and any(folder.glob("*.safetensors"))):
        return spec, "\n  latent miss curves: not measured (no weights: --model is not an HF folder); the planner uses ESS's"
    needed = 4 * model.total_weight_bytes() / model.dtype_bytes  # float32 in memory
    if needed > psutil.virtual_memory().available / 2:
        return spec, (f"\n  latent miss curves: not measured ({format_bytes(needed)} of float32 weights do not "
                      "fit in memory here); the planner uses ESS's")

    curves = latent_miss_curves(folder)
    mean = [sum(row[i] for row in curves.miss_fractions) / len(curves.miss_fractions)
            for i in range(len(curves.pool_fractions))]
    line = ("\n  latent misses (fraction of top-k, mean over layers) by pool size: "
            + ", ".join(f"{f:.0%}: {m:.3f}" for f, m in zip(curves.pool_fractions, mean)))
    return dataclasses.replace(spec, latent_miss_curves=curves), line
