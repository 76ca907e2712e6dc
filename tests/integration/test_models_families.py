"""The dense decoder families (every entry of tests/checkpoints.py's DENSE_FAMILIES: qwen3, gemma2,
gemma3_text, phi3, smollm3, granite, ernie4_5, olmo2; llama / mistral / qwen2 with biases and windows)
against transformers on tiny random checkpoints made by its own config classes (tests/family_models.py): prompt and 16 greedy steps, max |logit difference| <= 1e-4 and the
same greedy tokens, in memory and offloaded (weights over gpu / cpu / disk, the cache on either
tier: offloaded equals in memory bit for bit), through the Python API and the CLI.

The fast suite runs each family once (narrow, seed 0, tied for half of them); the slow sweep
runs two widths x two seeds x tied and untied heads."""

import json

import pytest
import torch
from click.testing import CliRunner

from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import GROUPS, make_checkpoint
from tests.family_models import (DECODE_STEPS, LOGIT_TOLERANCE, greedy_tokens, our_run, prompt_ids, reference_run,
                                 worst_gap)

GiB = 2**30
ON_GPU = TierSplit(gpu=1, cpu=0, disk=0)
SPREAD = TierSplit(gpu=0.3, cpu=0.3, disk=0.4)
OFFLOADED = {  # weights over the three tiers; the cache on the gpu tier, or on the cpu with attention there
    "cache_gpu": Policy(gpu_batch_size=2, num_gpu_batches=1, weights=SPREAD, cache=ON_GPU, activations=ON_GPU),
    "cache_cpu": Policy(gpu_batch_size=2, num_gpu_batches=1, weights=SPREAD, cache=TierSplit(gpu=0, cpu=1, disk=0),
                        activations=ON_GPU, cpu_attention=True),
}
KINDS = sorted(GROUPS["family"])
FAST = [(kind, "narrow", 0, i % 2 == 1) for i, kind in enumerate(KINDS)]
SWEEP = [(kind, width, seed, tied) for kind in KINDS for width in ("narrow", "wide") for seed in (0, 1)
         for tied in (False, True)]


def _check(folder, tmp_path, mixes=("cache_gpu",)) -> dict:
    """In memory and offloaded against transformers; returns the gaps (for the report)."""
    reader = open_checkpoint(folder)
    ids = prompt_ids(reader.config.vocab_size)
    expected, tokens = reference_run(folder, ids)
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    ours = our_run(plain, ids, tokens)
    gap = worst_gap(ours, expected)
    assert gap <= LOGIT_TOLERANCE, f"{folder.name}: max |logit difference| {gap:.3g}"
    assert all(torch.equal(a, b) for a, b in zip(greedy_tokens(ours), tokens)), f"{folder.name}: greedy tokens differ"
    for mix in mixes:
        ex = OffloadExecutor(reader, OFFLOADED[mix], model_spec=model_spec(reader.config),
                             gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / mix)
        assert {ex.tiers[n] for n in ex.tiers} == {"gpu", "cpu", "disk"}
        offloaded = our_run(ex, ids, tokens)
        ex.close()
        for step, (a, b) in enumerate(zip(ours, offloaded)):
            assert torch.equal(a, b), f"{folder.name} {mix}: offloaded differs from in memory at step {step}"
    return {"gap": gap}


@pytest.mark.parametrize("kind,width,seed,tied", FAST, ids=[f[0] for f in FAST])
def test_family_matches_transformers_in_memory_and_offloaded(kind, width, seed, tied, tmp_path):
    folder = make_checkpoint(tmp_path / kind, kind, seed, wide=width == "wide", tied=tied)
    _check(folder, tmp_path, mixes=("cache_gpu", "cache_cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("kind,width,seed,tied", SWEEP,
                         ids=[f"{k}-{w}-s{s}-{'tied' if t else 'untied'}" for k, w, s, t in SWEEP])
def test_family_sweep(kind, width, seed, tied, tmp_path):
    folder = make_checkpoint(tmp_path / kind, kind, seed, wide=width == "wide", tied=tied)
    _check(folder, tmp_path, mixes=tuple(OFFLOADED))


def _api_tokens(llm, ids) -> list[list[int]]:
    params = [SamplingParams(max_new_tokens=DECODE_STEPS, ignore_eos=True)] * len(ids)
    return [out.token_ids for out in llm.generate_ids(ids, params)]


@pytest.mark.parametrize("kind", ["gemma2", "phi3", "qwen2_window", "smollm3"])
def test_python_api_generates_transformers_greedy_tokens(kind, tmp_path):
    """flexlamps.LLM, in memory and offloaded over gpu / cpu / disk: transformers' greedy tokens."""
    from flexlamps import LLM

    folder = make_checkpoint(tmp_path / kind, kind, 1)
    ids = prompt_ids(open_checkpoint(folder).config.vocab_size, seed=5)
    _, tokens = reference_run(folder, ids)
    expected = torch.cat(tokens, dim=1).tolist()
    assert _api_tokens(LLM(str(folder), dtype="float32"), ids.tolist()) == expected
    offloaded = LLM(str(folder), dtype="float32", gpu_mem=GiB, cpu_mem=GiB, offload_dir=str(tmp_path / "off"),
                    policy=OFFLOADED["cache_gpu"])
    assert _api_tokens(offloaded, ids.tolist()) == expected
    offloaded.close()


def test_cli_generates_transformers_greedy_tokens(tmp_path):
    """`flexlamps generate` on a Gemma-3 checkpoint (window layers, local rope): transformers' tokens."""
    from flexlamps import LLM
    from flexlamps.cli import main

    folder = make_checkpoint(tmp_path / "gemma3", "gemma3_text", 2)
    texts = ["the quick brown fox jumps", "hello world, this is"]
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(main, ["generate", "--no-progress", "--model", str(folder), "--prompts", str(prompts),
                                    "--out", str(out), "--max-new-tokens", str(DECODE_STEPS), "--ignore-eos",
                                    "--logprobs", "--dtype", "float32"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    llm = LLM(str(folder), dtype="float32")
    for text, row in zip(texts, rows):
        ids = torch.tensor([llm.encode_prompt(text, False)])
        _, tokens = reference_run(folder, ids)
        assert row["token_ids"] == torch.cat(tokens, dim=1)[0].tolist()


def test_a_tensor_no_weight_reads_is_refused_before_loading(tmp_path):
    """A checkpoint tensor the forward would skip (here a q norm a LLaMA config does not turn on) is
    an error naming it when the checkpoint opens; a missing one too; rotary buffers are fine."""
    from safetensors.torch import load_file, save_file

    from flexlamps.models.loading.checkpoint import CheckpointError

    folder = make_checkpoint(tmp_path / "llama", "llama_bias")
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)},
              str(folder / "model.safetensors"))
    open_checkpoint(folder)
    save_file({**tensors, "model.layers.1.self_attn.q_norm.weight": torch.ones(16)}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.q_norm\.weight is not read"):
        open_checkpoint(folder)
    del tensors["model.layers.1.self_attn.o_proj.bias"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.self_attn\.o_proj\.bias .* is missing"):
        open_checkpoint(folder)


@pytest.mark.parametrize("kind,change", [
    ("mistral_window", {"attention": {"window": None}}),
    ("gemma2", {"attention": {"softcap": None}}),
    ("gemma3_text", {"attention": {"local_rope_theta": None}}),
    ("granite", {"decoder": {"residual_scale": 1.0}}),
])
def test_each_option_the_checkpoints_turn_on_moves_the_logits(kind, change, tmp_path):
    """The parity above can fail: running a family's model without one of its options leaves
    transformers' logits far behind (the window is crossed, the caps bite, ...)."""
    import dataclasses

    folder = make_checkpoint(tmp_path / kind, kind)
    reader = open_checkpoint(folder)
    ids = prompt_ids(reader.config.vocab_size)
    expected, tokens = reference_run(folder, ids)
    cfg = reader.config
    for part, fields in change.items():
        cfg = dataclasses.replace(cfg, **{part: dataclasses.replace(getattr(cfg, part), **fields)})
    plain = InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32)
    assert worst_gap(our_run(plain, ids, tokens), expected) > 100 * LOGIT_TOLERANCE
