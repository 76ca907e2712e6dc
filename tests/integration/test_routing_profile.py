"""`flexlamps profile --model M --prompts FILE` counts a MoE model's routing on the user's prompts;
the offload engine then places each layer's most-routed experts on the fastest tier, whole."""

import json

import pytest
import torch
from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.routing_profile import cached_routing, routing_cache_path
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import make_checkpoint

ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
PROMPTS = ["the quick brown fox", "jumps over the lazy dog", "hello world", "numbers 1 2 3"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("routing") / "m", "deepseek_v3_many_experts")


def test_profile_counts_routing_and_placement_follows_it(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEXLAMPS_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    result = CliRunner().invoke(main, ["profile", "--model", str(folder), "--prompts", str(prompts)])
    assert result.exit_code == 0, result.output
    reader = open_checkpoint(folder)
    assert routing_cache_path(reader.fingerprint()).exists()
    profile = cached_routing(reader)
    moe = reader.config.moe
    prompt_tokens = sum(len(reader.tokenizer.encode(p)) for p in PROMPTS)
    assert profile.tokens == prompt_tokens + 15 * len(PROMPTS)  # every token read: 16 generated, 15 fed back
    assert sorted(profile.counts) == ["0", "1"]
    assert all(sum(row) == profile.tokens * moe.num_experts_per_token for row in profile.counts.values())
    # each prompt traced step by step (its prompt, then 15 decode steps), per layer its experts
    assert [len(steps) for steps in profile.traces] == [16] * len(PROMPTS)
    for layer, row in profile.counts.items():
        traced = {e for steps in profile.traces for step in steps for e in step[layer]}
        assert traced == {e for e, n in enumerate(row) if n}
        assert all(1 <= len(steps[t][layer]) <= moe.num_experts_per_token
                   for steps in profile.traces for t in range(1, 16))  # a decode step: one token
    # an expert is placed whole; the gpu tier holds the most-routed ones
    policy = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=TierSplit(gpu=0.5, cpu=0.2, disk=0.3),
                    cache=ON_GPU, activations=ON_GPU)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=1 << 30, cpu_mem=1 << 30, offload_dir=tmp_path / "off",
                         dtype=torch.float32)
    try:
        for layer, experts in ex.experts.items():
            tiers = {e: {ex.tiers[n] for n in names} for e, names in experts.items()}
            assert all(len(t) == 1 for t in tiers.values())
            rank = {"gpu": 0, "cpu": 1, "disk": 2}
            order = profile.expert_order(layer)
            placed = [rank[tiers[e].pop()] for e in order]
            assert placed == sorted(placed) and placed[0] == 0 and placed[-1] == 2, placed
    finally:
        ex.close()


def test_profile_refuses_what_it_cannot_count(tiny_llama, folder, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    result = CliRunner().invoke(main, ["profile", "--prompts", str(prompts)])
    assert result.exit_code == 2 and "add --model" in result.output
    result = CliRunner().invoke(main, ["profile", "--model", str(tiny_llama), "--prompts", str(prompts)])
    assert result.exit_code == 2 and "has no routed experts" in result.output
    (tmp_path / "blank.txt").write_text("\n\n")
    result = CliRunner().invoke(main, ["profile", "--model", str(folder), "--prompts", str(tmp_path / "blank.txt")])
    assert result.exit_code == 2 and "holds no prompts" in result.output
    result = CliRunner().invoke(main, ["profile"])
    assert result.exit_code == 2 and "give --out" in result.output
