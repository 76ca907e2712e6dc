"""`flexlamps plan --model file.gguf`: the planner reads a GGUF's description through its family's
reader of the metadata (`gguf_description`), the one the engine loads it with, without torch, and
prices the matrices the engine keeps as the file's blocks at the bytes their kind stores them in
(`gguf_codes`); `generate`'s LP prices them at the executor's own samples' bytes, so it plans in
memory what fits as codes and agrees with the dry run."""

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import placement
from flexlamps.catalog import describe_model
from flexlamps.cli import main
from flexlamps.engine.executors.weight_store import WeightStore, in_place_bytes, in_place_coded
from flexlamps.models.description import model_spec, with_codes
from flexlamps.models.loading.checkpoint import GGUFReader
from flexlamps.models.blocks.weight_kind import kind_of
from flexlamps.models.loading import in_place
from flexlamps.models.loading.gguf_codes import KERNEL_TILE, CodeForms, gguf_coded_bytes
from flexlamps.models.loading.gguf_header import open_gguf
from flexlamps.models.loading.in_place import in_place_form, keeps_k_scales, packs_five_bit
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.policy_choice import plan_policy
from flexlamps.planning.target import BlockLengths, Compression, PlanTarget
from placement.choice import Choice
from offload.store import stored_parts
from placement.layer_sizes import layer_sizes
from tests.checkpoints import GGUF_MOE_OVERRIDES, make_checkpoint
from tests.decoder_gguf import write_decoder_gguf
from tests.gguf_models import write_llama_gguf
from tests.unit.test_gguf_kquants import kquant_types

SHAPE = dict(hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=300)


def _gguf(tmp_path, types=lambda name, layer: None if name.endswith("norm") else "Q8_0"):
    return write_llama_gguf(tmp_path / "tiny-llama.gguf", types, **SHAPE)


def _every(type_name: str):
    return lambda name, layer: None if name.endswith("norm") else type_name


def _types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in open_gguf(path).tensors}


def test_plan_describes_a_gguf_as_the_engine_reads_it(tmp_path):
    path = _gguf(tmp_path)
    spec = describe_model(str(path))
    config = GGUFReader(path).config
    assert spec == with_codes(model_spec(config, name="tiny-llama"), config, gguf_coded_bytes(config, _types(path)))
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.intermediate_size,
            spec.vocab_size) == (2, 64, 4, 2, 128, 300)
    # every matrix and the tied head's blocks as codes (Q8_0: 10 bits a weight), the table and norms bf16
    assert spec.tensors.codes_bytes() == sum(r.stored_bytes * r.instances for r in spec.tensors.rows
                                             if r.is_matrix or r.name == "lm_head")


TYPES = {"q8_0": _every("Q8_0"), "q4_0": _every("Q4_0"), "q6_k": _every("Q6_K"), "q4_k_m": kquant_types}


@pytest.mark.parametrize("types", sorted(TYPES))
def test_the_planned_codes_are_the_bytes_the_executor_stores(tmp_path, types):
    """`gguf_coded_bytes` (torch-free, `flexlamps plan`'s) in this machine's forms gives each matrix kept
    as codes the bytes its kind stores the matrix read from the file in (`in_place_form`), exactly, tile
    padding of the narrow k / v rows included; so do the store's descriptions (`in_place_bytes`), the
    tied head's table pieces and their parts' names too."""
    path = write_llama_gguf(tmp_path / f"{types}.gguf", TYPES[types], hidden=256, ffn=512, layers=2, heads=4,
                            kv_heads=2, vocab=300)
    reader = GGUFReader(path)
    forms = CodeForms(native=keeps_k_scales(), five_bit=packs_five_bit())
    specs, coded = in_place_coded(reader, torch.bfloat16)
    held = {name: in_place_form(reader, spec, torch.bfloat16) for name, spec in specs.items()}
    assert gguf_coded_bytes(reader.config, _types(path), forms) == in_place_bytes(coded) == \
        {name: kind_of(w).stored_bytes(w) for name, w in held.items()}
    for start, stop in ((0, 64), (64, 256), (256, 300)):  # a table's pieces: whole kernel tiles, the last short
        piece, kept = coded["lm_head"].rows(start, stop), held["lm_head"].rows(start, stop)
        assert piece.nbytes == kind_of(kept).stored_bytes(kept)
        assert piece.part_names("p::") == list(stored_parts(kept, "p::"))
    # the planner's whole model is what the executor's store holds, every weight on the cpu tier
    on_cpu = placement.TierSplit(gpu=0, cpu=1, disk=0)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_cpu, cache=on_cpu, activations=on_cpu)
    store = WeightStore(reader.config, policy, torch.bfloat16, device_type="cpu", in_place=coded)
    planned = with_codes(model_spec(reader.config), reader.config, in_place_bytes(coded))
    assert planned.total_weight_bytes() == sum(store.stored.values())


def test_sizing_the_codes_builds_no_matrix(tmp_path, monkeypatch):
    """The dry run sizes the file's blocks from the formula: no sample of a matrix's size is built (a
    1B's tied head, 128256 x 2048, took a process from 278 to 1455 MiB peak RSS), only one kernel tile
    of rows where a form's parts' names are asked for."""
    path = write_llama_gguf(tmp_path / "q4_k_m.gguf", kquant_types, hidden=256, ffn=512, layers=2, heads=4,
                            kv_heads=2, vocab=300)
    reader = GGUFReader(path)
    built = []
    real = in_place._sample
    monkeypatch.setattr(in_place, "_sample", lambda kind, shape, *rest: built.append(shape) or real(kind, shape, *rest))
    in_place._part_names.cache_clear()
    coded = in_place_coded(reader, torch.bfloat16)[1]
    split = placement.TierSplit(gpu=0.2, cpu=0.3, disk=0.5)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=split, cache=split, activations=split)
    store = WeightStore(reader.config, policy, torch.bfloat16, device_type="cpu", in_place=coded)
    assert "disk" in store.tiers.values() and store.stored
    coded_names = [name for name in store.stored if store.keeps_codes(name)]
    assert all(store.coded_piece(name, store._piece_named(name)).part_names("x::") for name in coded_names)
    assert coded_names and all(shape[0] == KERNEL_TILE for shape in built)


def test_generate_plans_in_memory_what_fits_as_codes(tmp_path):
    """A budget that holds the Q4_K codes (2.0 MB) but not bf16 (6.4 MB): generate's LP (`plan_policy`
    with the file's blocks, `PlanTarget.in_place`) keeps every weight in memory, where priced as bf16
    it sent 55% to disk; its peaks are the dry run's (the engine's charges) to the byte."""
    path = write_llama_gguf(tmp_path / "q4_k.gguf", _every("Q4_K"), hidden=256, ffn=768, layers=4, heads=4,
                            kv_heads=2, vocab=256)
    reader = GGUFReader(path)
    budgets = dict(gpu_mem=4 << 20, cpu_mem=2 << 20)
    lengths = BlockLengths(prompt_len=16, gen_len=4)

    def plan(in_place):
        target = PlanTarget(config=reader.config, model=model_spec(reader.config), dtype=torch.bfloat16,
                            in_place=in_place)
        return target, plan_policy(target, placement.hardware_preset("t4-flexgen"), lengths, disk_bytes=1 << 30,
                                   max_block_size=2, compression=Compression(allow=False), **budgets)

    target, codes = plan(in_place_coded(reader, torch.bfloat16)[1])
    assert codes.policy.weights.disk == 0
    assert dry_run(target, codes.policy, lengths, **budgets).peak_bytes == pytest.approx(codes.peak_bytes, rel=1e-6)
    assert plan(None)[1].policy.weights.disk > 0.5  # the same file priced as bf16


def test_plan_command_prices_a_gguf(tmp_path):
    path = _gguf(tmp_path)
    result = CliRunner().invoke(main, ["plan", "--model", str(path), "--hardware", "t4-flexgen", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["model"]["name"] == "tiny-llama" and out["model"]["num_layers"] == 2
    assert out["plan"]["tokens_per_s"] > 0


def test_plan_names_a_damaged_gguf(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(_gguf(tmp_path).read_bytes()[:64])  # the magic, then the header cut short
    result = CliRunner().invoke(main, ["plan", "--model", str(path), "--hardware", "t4-flexgen"])
    assert result.exit_code == 2 and "truncated" in result.output and "cut.gguf" in result.output


def test_a_gguf_is_described_without_torch(tmp_path):
    path = _gguf(tmp_path)
    code = ("import sys; from flexlamps.catalog import describe_model; "
            f"spec = describe_model({str(path)!r}); assert 'torch' not in sys.modules, 'torch imported'; "
            "print(spec.num_layers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr


def test_compression_prices_a_codes_matrix_from_its_values(tmp_path):
    """A policy that compresses weights re-quantizes a kept block from its values: a layer prices
    as the bf16 description's does (stored, expanded, dequantized), never the codes' bytes shrunk
    again; uncompressed, it holds the codes' bytes."""
    path = write_llama_gguf(tmp_path / "q4_k.gguf", _every("Q4_K"), hidden=256, ffn=512, layers=2, heads=4,
                            kv_heads=2, vocab=300)
    config = GGUFReader(path).config
    dense = model_spec(config)
    codes = with_codes(dense, config, gguf_coded_bytes(config, _types(path)))
    workload = placement.WorkloadSpec(prompt_len=16, gen_len=4)
    compressed = Choice(gpu_batch_size=1, num_gpu_batches=1, compress_weight=True)
    ours, theirs = layer_sizes(compressed, codes, workload), layer_sizes(compressed, dense, workload)
    assert (ours.layer_stored, ours.layer_matrices) == pytest.approx((theirs.layer_stored, theirs.layer_matrices))
    assert codes.expanded_bytes_per_layer() == dense.weight_bytes_per_layer()
    plain = layer_sizes(Choice(gpu_batch_size=1, num_gpu_batches=1), codes, workload)
    assert plain.layer_stored == codes.weight_bytes_per_layer() < 0.35 * dense.weight_bytes_per_layer()


def test_a_moe_gguf_plans_its_experts_blocks_as_stored(tmp_path):
    """Mixtral's experts in Q8_0 slabs of stacked tensors, the rest f32: `flexlamps plan` prices the
    experts at their codes' bytes and the other tensors in bf16, the dtype a run picks for such a
    file, so its whole model is what the executor's store holds, to the byte."""
    folder = make_checkpoint(tmp_path / "mixtral", "mixtral", **GGUF_MOE_OVERRIDES["mixtral"])
    path = write_decoder_gguf(folder, tmp_path / "q8.gguf", quantize_experts="Q8_0")
    reader = GGUFReader(path, cache_dir=tmp_path / "cache")
    samples = in_place_coded(reader, torch.bfloat16)[1]
    assert samples and all(".experts." in name for name in samples)
    on_cpu = placement.TierSplit(gpu=0, cpu=1, disk=0)
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=on_cpu, cache=on_cpu, activations=on_cpu)
    store = WeightStore(reader.config, policy, torch.bfloat16, device_type="cpu", in_place=samples)
    spec = describe_model(str(path))
    assert spec.dtype == "bf16" and spec.total_weight_bytes() == sum(store.stored.values())
    assert spec.coded_per_layer(routed_only=True) == spec.coded_per_layer()  # every kept block an expert's
