"""A GGUF's quantized matrices on the offload engine: kept as the file's blocks on every tier, as
the in-memory engine keeps them (`models.loading.in_place`), so both run the same kinds' products
and give the same bits, prompts and decode alike; each stored matrix is charged what its kind
stores (`WeightKind.stored_bytes`), and an offload folder written so is read back as it is."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.blocks.weight_kind import KINDS, is_dense, kind_of
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from offload import tensor_bytes
from offload.store import stored_parts
from placement import Policy, TierSplit
from tests.checkpoint_zoo import CheckpointZoo

GiB = 2**30
ON_GPU = TierSplit(gpu=1, cpu=0, disk=0)
EVERY_TIER = TierSplit(gpu=0.15, cpu=0.25, disk=0.6)
ALIGNED_VOCAB = 9024  # 141 tiles of 64 rows: the head's codes cut in pieces of whole tiles, over tiers
RAGGED_VOCAB = 9000  # not whole tiles: the head's codes stay one piece (its kernel is the whole's)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return CheckpointZoo(tmp_path_factory.mktemp("in_place_zoo"))


def _policy(weights=EVERY_TIER):
    return Policy(gpu_batch_size=2, num_gpu_batches=2, weights=weights, cache=ON_GPU, activations=ON_GPU)


def _steps(vocab: int):
    """A prompt chunk of two rows, a prompt of one, then a decode of the three."""
    ids = torch.randint(2, vocab, (3, 20), generator=torch.Generator().manual_seed(1))
    return [[Step(ids[:2, :12], torch.arange(12).expand(2, 12), torch.tensor([0, 1])),
             Step(ids[2:, :20], torch.arange(20).expand(1, 20), torch.tensor([2]))],
            [Step(ids[:, 12:13], torch.tensor([[12], [12], [20]]), torch.tensor([0, 1, 2]))]]


def _logits(ex, vocab: int) -> list[torch.Tensor]:
    cache = ex.new_cache(3, 32)
    return [out for steps in _steps(vocab) for out in ex.forward_steps(cache, steps)]


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("kind, vocab", [("gguf:llama:Q4_0", ALIGNED_VOCAB), ("gguf:llama:Q8_0", RAGGED_VOCAB),
                                         ("gguf:llama:Q4_K_M", ALIGNED_VOCAB), ("gguf:llama:Q5_1", None),
                                         ("gguf:mixtral:Q8_0", None)])
def test_offloaded_blocks_give_the_in_memory_bits(zoo, tmp_path, kind, vocab):
    reader = open_checkpoint(zoo.path(kind, vocab))
    dtype = torch.bfloat16
    weights = read_all(reader, dtype, int4_in_place=True)
    plain = InMemoryExecutor(reader.config, weights, dtype)
    ref = _logits(plain, reader.config.vocab_size)
    for reuse in (False, True):  # the folder written, then read back as it is
        ex = OffloadExecutor(reader, _policy(), model_spec=model_spec(reader.config),
                             gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off", dtype=dtype,
                             device=torch.device("cpu"))
        assert ex.reused_disk == reuse
        assert {"gpu", "cpu", "disk"} <= set(ex.tiers.values())
        for a, b in zip(ref, _logits(ex, reader.config.vocab_size)):
            assert torch.equal(a, b)
        _assert_kept_as_blocks_and_charged_so(ex, {name for name, w in weights.items() if not is_dense(w)})
        ex.close()


def _assert_kept_as_blocks_and_charged_so(ex, in_memory_blocks: set[str]) -> None:
    """The matrices the in-memory engine keeps as blocks are those stored so (no dense copy),
    each charged its kind's `stored_bytes`, the bytes its stored parts take, wherever it lies."""
    coded = {name for name in ex.tiers if ex.weights.keeps_codes(name)}
    assert {name.split(".rows")[0] for name in coded} == in_memory_blocks
    for name in coded:
        fetched, staged = ex.store.fetch([name])
        w = fetched[name]
        ex.store.release(staged)
        assert type(w) in KINDS and not is_dense(w)
        assert ex.weights.stored[name] == kind_of(w).stored_bytes(w) == tensor_bytes(*stored_parts(w, "").values())


def test_a_float32_run_keeps_no_blocks(zoo, tmp_path):
    """The kernels take 16-bit activations: in float32 both engines read the matrices dense."""
    reader = open_checkpoint(zoo.path("gguf:llama:Q4_0"))
    ex = OffloadExecutor(reader, _policy(ON_GPU), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off",
                         dtype=torch.float32, device=torch.device("cpu"))
    assert not any(ex.weights.keeps_codes(name) for name in ex.tiers)
    ex.close()
