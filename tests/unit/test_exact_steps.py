"""A row's logits are bit-identical (fp32) whatever shares its steps: other rows of other
lengths (a longer padded span), other micro-batches, and however its tokens are chunked
(decoded one by one, a prompt in chunks, a recompute in one go); for the in-memory executor's
dense and paged caches and the offload executor's tiered and paged caches."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit

MiB = 2**20
GPU, CPU = TierSplit(gpu=1, cpu=0, disk=0), TierSplit(gpu=0, cpu=1, disk=0)
HALF = TierSplit(gpu=0.5, cpu=0.5, disk=0)
LENGTH = 23  # the row's tokens
CHUNKINGS = [[LENGTH], [5, 1, 9, 1, 1, 6], [1, 1, 2, 19], [12, 11]]
ROWS, TARGET = 4, 2  # the row under test shares every step with three others
BLOCK = 8  # paged caches: tokens per block
OFFSETS = {0: 40, 1: 3, 3: 71}  # other rows' first positions: their spans pass the row's own


@pytest.fixture(scope="module")
def reader(tiny_models):
    return open_checkpoint(tiny_models["llama_gqa"])


@pytest.fixture(scope="module")
def plain(reader):
    """The in-memory executor: the reference every cache and executor here must equal bit for bit."""
    weights = read_all(reader, torch.float32)
    return InMemoryExecutor(reader.config, weights, torch.float32)


@pytest.fixture(scope="module")
def tokens(reader):
    g = torch.Generator().manual_seed(1)
    return torch.randint(2, reader.config.vocab_size, (ROWS, 128), generator=g)


def _alone(executor, tokens) -> torch.Tensor:
    """The row decoded token by token, alone in a one-row cache: (LENGTH, vocab)."""
    cache = executor.new_cache(1, LENGTH)
    out = [executor.forward_steps(cache, [Step(tokens[TARGET, p:p + 1][None], torch.tensor([[p]]), torch.tensor([0]))])[0]
           for p in range(LENGTH)]
    cache.release()
    return torch.cat(out, dim=1)[0]


def _shared(executor, cache, slots, tokens, chunks) -> torch.Tensor:
    """The row computed in `chunks`, each sweep also running rows 0 and 3 in its micro-batch
    (same chunk length, further along) and row 1 in a micro-batch of its own."""
    out, start = [], 0
    for t in chunks:
        rows = [0, TARGET, 3]
        pos = torch.stack([torch.arange(t) + (OFFSETS.get(r, 0) + start) for r in rows])
        ids = torch.stack([tokens[r].roll(-int(p[0]))[:t] for r, p in zip(rows, pos)])
        other = torch.arange(3) + OFFSETS[1] + 3 * len(out)
        steps = [Step(ids, pos, slots[rows]), Step(tokens[1, :3][None], other[None], slots[[1]])]
        out.append(executor.forward_steps(cache, steps)[0][1])
        start += t
    return torch.cat(out, dim=0)


def _dense(executor):
    return executor.new_cache(ROWS, 128), torch.arange(ROWS)


def _paged(executor):
    blocks_per_row = 128 // BLOCK
    cache = executor.new_paged_cache(ROWS * blocks_per_row, 0, BLOCK)
    # each row's blocks scattered through the pool
    tables = [[b * ROWS + (ROWS - 1 - r) for b in range(blocks_per_row)] for r in range(ROWS)]
    return cache, cache.set_block_tables(tables).cpu()


def _offloaded(reader, tmp_path, cache_split, cpu_attention=False):
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=TierSplit(gpu=0.3, cpu=0.4, disk=0.3),
                    cache=cache_split, activations=GPU, cpu_attention=cpu_attention)
    # on the CPU, as `plain`: bit-identity is the CPU's guarantee (cuBLAS picks kernels by shape;
    # on CUDA the gpu-marked tests compare within a tolerance)
    return OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                           gpu_mem=256 * MiB, cpu_mem=256 * MiB, offload_dir=tmp_path / "off",
                           device=torch.device("cpu"))


@pytest.mark.parametrize("kind", ["dense", "paged"])
def test_in_memory_row_independent_of_its_steps(plain, tokens, kind):
    reference = _alone(plain, tokens)
    for chunks in CHUNKINGS:
        cache, slots = (_dense if kind == "dense" else _paged)(plain)
        assert torch.equal(_shared(plain, cache, slots, tokens, chunks), reference), chunks


@pytest.mark.parametrize("kind", ["gpu_tier", "cpu_tier_cpu_attention", "half_staged", "paged"])
def test_offloaded_row_independent_of_its_steps(reader, plain, tokens, kind, tmp_path):
    split = {"gpu_tier": GPU, "cpu_tier_cpu_attention": CPU, "half_staged": HALF, "paged": GPU}[kind]
    executor = _offloaded(reader, tmp_path, split, cpu_attention=kind == "cpu_tier_cpu_attention")
    reference = _alone(plain, tokens)  # the in-memory executor's: offloading changes no bit
    assert torch.equal(_alone(executor, tokens), reference)
    for chunks in CHUNKINGS[1:3]:
        cache, slots = (_paged if kind == "paged" else _dense)(executor)
        assert torch.equal(_shared(executor, cache, slots, tokens, chunks), reference), chunks
        cache.release()
    executor.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_logits_conversion_is_torchs_on_one_thread(dtype):
    """`float_logits` (numpy, this thread only) gives `.float()`'s bits: signed zeros, infinities,
    a NaN, subnormals, a row picked out of a wider tensor (strided)."""
    from flexlamps.engine.executors.in_memory import float_logits

    gen = torch.Generator().manual_seed(0)
    wide = (torch.randn(3, 2 * 128256, generator=gen) * 30).to(dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -3e-41, 6e-8])
    wide[0, :8] = special.to(dtype)
    logits = wide[:, ::2]
    got = float_logits(logits)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    assert torch.equal(got.view(torch.int32), logits.float().view(torch.int32))
