"""`flexlamps generate` on tiny checkpoints of several families, in memory and offloaded (weights over
gpu / cpu / disk with --gpu-mem / --cpu-mem / --offload-dir and a policy): the same text both ways,
and the in-memory run's tokens are transformers' greedy tokens (float32)."""

import json

import pytest
import torch
from click.testing import CliRunner

from flexlamps.cli import main
from tests.checkpoints import make_checkpoint
from tests.family_models import reference_run

NEW_TOKENS = 12
TEXTS = ["the quick brown fox jumps", "hello world, this is", "numbers 1 2 3"]
SPREAD = {"gpu_batch_size": 2, "num_gpu_batches": 2, "weights": {"gpu": 0.2, "cpu": 0.3, "disk": 0.5},
          "cache": {"gpu": 1, "cpu": 0, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}
FAST = ["gemma2", "olmoe", "phi3"]
SLOW = ["gemma3_text", "qwen3", "smollm3", "granite", "glm4_moe", "gpt_oss", "qwen3_moe", "deepseek_v2"]


def _make(kind, folder):
    return make_checkpoint(folder, kind, seed=4)


def _generate(folder, prompts, out, *extra):
    res = CliRunner().invoke(main, ["generate", "--no-progress", "--model", str(folder), "--prompts", str(prompts),
                                    "--out", str(out), "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos",
                                    "--logprobs", "--dtype", "float32", *extra], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def _check(kind, tmp_path):
    from flexlamps import LLM

    folder = _make(kind, tmp_path / kind)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(TEXTS)))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(SPREAD))
    plain = _generate(folder, prompts, tmp_path / "plain.jsonl")
    offloaded = _generate(folder, prompts, tmp_path / "off.jsonl", "--gpu-mem", "64MiB", "--cpu-mem", "64MiB",
                          "--offload-dir", str(tmp_path / "off"), "--policy", str(policy))
    assert [r["text"] for r in offloaded] == [r["text"] for r in plain]
    assert [r["token_ids"] for r in offloaded] == [r["token_ids"] for r in plain]
    llm = LLM(str(folder), dtype="float32")
    for text, row in zip(TEXTS, plain):
        _, tokens = reference_run(folder, torch.tensor([llm.encode_prompt(text, False)]), steps=NEW_TOKENS)
        assert row["token_ids"] == torch.cat(tokens, dim=1)[0].tolist(), f"{kind}: {text!r}"


@pytest.mark.parametrize("kind", FAST)
def test_cli_generates_the_same_text_in_memory_and_offloaded(kind, tmp_path):
    _check(kind, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", SLOW)
def test_cli_generates_the_same_text_in_memory_and_offloaded_more_families(kind, tmp_path):
    _check(kind, tmp_path)


@pytest.mark.parametrize("kind", ["gemma2", "phi3"])
def test_cli_on_the_gguf_gives_the_hf_folders_text(kind, tmp_path):
    """`flexlamps generate --model X.gguf` (the checkpoint written as llama.cpp's GGUF, its tokenizer
    as GPT-2's vocabulary) writes the Hugging Face folder's text and tokens, in memory and offloaded."""
    from tests.decoder_gguf import write_decoder_gguf
    from tests.checkpoints import GGUF_FIELDS

    folder = make_checkpoint(tmp_path / kind, GGUF_FIELDS[kind], seed=4, tied=True)
    gguf_file = write_decoder_gguf(folder, tmp_path / f"{kind}.gguf")
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(TEXTS)))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(SPREAD))
    want = _generate(folder, prompts, tmp_path / "hf.jsonl")
    for name, extra in (("plain", ()), ("off", ("--gpu-mem", "64MiB", "--cpu-mem", "64MiB", "--offload-dir",
                                                 str(tmp_path / "off"), "--policy", str(policy)))):
        got = _generate(gguf_file, prompts, tmp_path / f"gguf-{name}.jsonl", *extra)
        assert [(r["text"], r["token_ids"]) for r in got] == [(r["text"], r["token_ids"]) for r in want], name
