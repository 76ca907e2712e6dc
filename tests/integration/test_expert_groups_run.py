"""Any gpu tier that holds a few experts runs a MoE model: a Qwen3-MoE-shaped model (32 experts,
top-2) mostly on disk, whose prompt touches more of a layer's experts than an 8 MiB gpu tier
holds, planned by `--policy auto`'s planner: its experts stream through the gpu tier in groups,
a decode step reads at most 0.3x the disk-resident bytes, and the logits are the in-memory
run's, bit for bit in float32."""

import dataclasses

import pytest
import torch

import placement
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.planning import policy_choice
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.target import BlockLengths, Compression
from offload import BudgetExceededError
from tests.checkpoints import make_checkpoint
from tests.described import plan_target

MiB = 1 << 20
GPU_MEM, CPU_MEM = 8 * MiB, 2 * MiB
PROMPT_LEN, DECODE_STEPS = 40, 6
LENGTHS = BlockLengths(prompt_len=PROMPT_LEN, gen_len=DECODE_STEPS + 1)
# a layer's 32 experts: 32 x 3 x 192 x 160 fp32 = 11.2 MiB, more than the gpu tier
SHAPE = dict(hidden_size=192, moe_intermediate_size=160, num_experts=32, num_experts_per_tok=2, decoder_sparse_step=1,
             num_hidden_layers=4, head_dim=48, intermediate_size=192)


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return open_checkpoint(make_checkpoint(tmp_path_factory.mktemp("moe") / "qwen3_moe", "qwen3_moe", **SHAPE))


def _plan(reader):
    return policy_choice.plan_policy(plan_target(reader.config, torch.float32), placement.hardware_preset("t4-flexgen"),
                                     LENGTHS, gpu_mem=GPU_MEM, cpu_mem=CPU_MEM, disk_bytes=1 << 33, max_block_size=1,
                                     compression=Compression(allow=False))


def _read_bytes() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


def _run(ex, reads: list | None = None) -> list[torch.Tensor]:
    """A prompt's prefill and greedy decode steps: each step's logits (and each decode step's bytes read)."""
    ids = torch.randint(2, ex.cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(5))
    cache = ex.new_cache(1, PROMPT_LEN + DECODE_STEPS)
    out = ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN)[None], torch.tensor([0]))])[0]
    logits = [out[:, -1]]
    for pos in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        before = _read_bytes()
        step = Step(out[:, -1:].argmax(-1), torch.tensor([[pos]]), torch.tensor([0]))
        out = ex.forward_steps(cache, [step])[0]
        if reads is not None:
            reads.append(_read_bytes() - before)
        logits.append(out[:, -1])
    return logits


@pytest.mark.slow
@pytest.mark.ci
def test_an_8_mib_gpu_tier_streams_the_experts_and_runs_as_in_memory(reader, tmp_path):
    plan = _plan(reader)
    assert plan.policy.expert_group > 0
    with pytest.raises(BudgetExceededError, match="gpu"):  # every touched expert staged at once: too big
        dry_run(plan_target(reader.config, torch.float32), dataclasses.replace(plan.policy, expert_group=0), LENGTHS,
                gpu_mem=GPU_MEM, cpu_mem=CPU_MEM)
    expected = _run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32))
    ex = OffloadExecutor(reader, plan.policy, model_spec=model_spec(reader.config),
                         gpu_mem=GPU_MEM, cpu_mem=CPU_MEM, offload_dir=tmp_path / "off",
                         dtype=torch.float32)
    reads = []
    try:
        got = _run(ex, reads)
        disk = sum(ex.weights.stored[name] for name, tier in ex.tiers.items() if tier == "disk")
        assert disk > 0.8 * sum(ex.weights.stored.values())  # weights mostly on disk
        assert ex.budgets["gpu"].peak_bytes <= GPU_MEM
    finally:
        ex.close()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert max(reads) <= 0.3 * disk, (max(reads), disk)

