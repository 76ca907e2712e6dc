"""KV cache layers on the disk tier (`caches.disk_rows`): files in the offload folder, mapped and
paged by the OS, charged to no memory budget; the text equals the in-memory engine's."""

import pytest
import torch

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit

GiB = 2**30
ALL_GPU = TierSplit(gpu=1, cpu=0, disk=0)
PROMPTS = ["hello world", "the quick brown fox jumps over", "numbers 1 2 3 4 5", "a"]


@pytest.fixture(scope="module")
def reader(tiny_models):
    return open_checkpoint(tiny_models["llama_gqa"])


def _executor(reader, folder, cache: TierSplit, **kw) -> OffloadExecutor:
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=ALL_GPU, cache=cache, activations=ALL_GPU, **kw)
    return OffloadExecutor(reader, policy, gpu_mem=GiB, cpu_mem=GiB, offload_dir=folder)


@pytest.mark.parametrize("cpu_attention", [False, True])
def test_a_cache_on_disk_generates_the_in_memory_text_and_charges_no_memory(reader, tmp_path, cpu_attention):
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    ex = _executor(reader, tmp_path / "off", TierSplit(gpu=0, cpu=0.5, disk=0.5), cpu_attention=cpu_attention)
    cache = ex.new_cache(4, 64)
    tiers = cache.tiers
    assert "disk" in tiers and "cpu" in tiers
    assert [tier for tier, _ in cache._charged] == [t for t in tiers if t != "disk"]  # disk layers: no budget
    assert not any((tmp_path / "off").iterdir()), "a cache file was left in the folder"
    cache.release()
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (6, 3, 8, 5)]
    ids = [reader.tokenizer.encode(p) for p in PROMPTS]
    expected = [o.token_ids for o in generate(plain, reader.tokenizer, ids, params, max_batch=3)]
    got = [o.token_ids for o in generate(ex, reader.tokenizer, ids, params, max_batch=3, micro_batch=2)]
    assert got == expected
    ex.close()


def test_a_compressed_cache_on_disk_holds_the_same_codes_as_on_the_cpu_tier(reader, tmp_path):
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
