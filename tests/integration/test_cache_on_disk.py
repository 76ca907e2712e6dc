"""KV cache layers on the disk tier (`caches.disk_rows`): files in the offload folder, mapped and
paged by the OS, charged to no memory budget. The text equals the in-memory engine's:
`test_offload_engine.py`'s `cache_disk_*` tier mixes."""

import json

import pytest
import torch

from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.target import BlockLengths
from placement import Policy, TierSplit
from tests.described import plan_target

GiB = 2**30
ALL_GPU = TierSplit(gpu=1, cpu=0, disk=0)


def _executor(reader, folder, cache: TierSplit, **kw) -> OffloadExecutor:
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=ALL_GPU, cache=cache, activations=ALL_GPU, **kw)
    return OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                           gpu_mem=GiB, cpu_mem=GiB, offload_dir=folder)


def test_disk_layers_charge_no_memory_budget_and_leave_no_file(tiny_models, tmp_path):
    ex = _executor(open_checkpoint(tiny_models["llama_gqa"]), tmp_path / "off", TierSplit(gpu=0, cpu=0.5, disk=0.5))
    cpu_before = ex.budgets["cpu"].used_bytes
    cache = ex.new_cache(4, 64)
    assert "disk" in cache.tiers and "cpu" in cache.tiers
    assert [tier for tier, _ in cache._charged] == [t for t in cache.tiers if t != "disk"]
    assert ex.budgets["cpu"].used_bytes - cpu_before == sum(n for _, n in cache._charged)
    assert not any((tmp_path / "off").iterdir()), "a cache file was left in the folder"
    cache.release()
    ex.close()


def test_a_compressed_cache_on_disk_holds_the_same_codes_as_on_the_cpu_tier(tiny_models, tmp_path):
    reader = open_checkpoint(tiny_models["llama_gqa"])
    steps = [Step(torch.arange(2, 14).expand(2, 12), torch.arange(12).expand(2, 12), torch.tensor([0, 1]))]
    decode = [Step(torch.tensor([[5], [6]]), torch.tensor([[12], [12]]), torch.tensor([0, 1]))]
    outs = []
    for name, split in (("cpu", TierSplit(gpu=0, cpu=1, disk=0)), ("disk", TierSplit(gpu=0, cpu=0, disk=1))):
        ex = _executor(reader, tmp_path / name, split, compress_cache=True)
        cache = ex.new_cache(4, 64)
        assert set(cache.tiers) == {name} and (name == "cpu") == bool(cache._charged)
        outs.append(ex.forward_steps(cache, steps) + ex.forward_steps(cache, decode))
        ex.close()
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_an_mla_latent_cache_on_disk_is_refused_by_the_executor_and_its_dry_run(deepseek_models, tmp_path):
    """The executor keeps a latent cache in memory; the dry run (what `plan_policy` trusts) must refuse
    the same policy, not charge it as a KV cache on disk and call it feasible."""
    folder = deepseek_models["deepseek_v3"]
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=ALL_GPU, cache=TierSplit(gpu=0, cpu=0.5, disk=0.5),
                    activations=ALL_GPU)
    reader = open_checkpoint(folder)
    with pytest.raises(ValueError, match="latent cache or a DeltaNet state on disk"):
        OffloadExecutor(reader, policy, model_spec=model_spec(reader.config), gpu_mem=GiB, cpu_mem=GiB,
                        offload_dir=tmp_path / "off")
    with pytest.raises(ValueError, match="latent cache or a DeltaNet state on disk"):
        dry_run(plan_target(json.loads((folder / "config.json").read_text())), policy,
                BlockLengths(prompt_len=8, gen_len=4), gpu_mem=GiB, cpu_mem=GiB)
