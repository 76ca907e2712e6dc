"""The native loop (`models.blocks.native_decode`): a step's layers in one call give every row the
Python forward's bits, its logits and the keys and values it writes, for prompt chunks (from
position 0, and after cached keys) and decode steps, rows in a block of slots or scattered, at
positions of their own; models it does not take run the Python forward."""

from unittest import mock

import pytest
import torch

from flexlamps import LLM
from flexlamps.engine.executors.step import Step
from flexlamps.kernels import loader
from flexlamps.kernels.decode_layers import DecodeLayers
from flexlamps.models.blocks.native_decode import NativeDecode
from tests.checkpoint_zoo import CheckpointZoo

PROMPT = 20  # tokens each row holds before the decode steps, fed in two chunks
SECOND_CHUNK = 3  # the prompt's last tokens, a chunk after the first one's cached keys
STEPS = 3


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    if loader.chosen().get("decode_layers") is None:
        pytest.skip("the native decode loop does not run here (no AVX2, no compiler, or switched off)")
    return CheckpointZoo(tmp_path_factory.mktemp("native_decode_zoo"))


def _decode(executor, slots: torch.Tensor, offsets: torch.Tensor, native: bool, prompt: int = PROMPT):
    """Logits of a prompt in two chunks and STEPS decode steps of rows `slots`, each row `offsets`
    further along in the decode (keys it never wrote read as the cache's zeros on both paths), and
    the cache."""
    saved = executor.native_layers
    executor.native_layers = saved if native else None
    cache = executor.new_cache(8, prompt + STEPS + int(offsets.max()) + 1)
    n, first = len(slots), prompt - SECOND_CHUNK
    ids = torch.randint(3, 200, (n, prompt + STEPS), generator=torch.Generator().manual_seed(0))
    steps = [Step(ids[:, :first], torch.arange(first).expand(n, -1), slots),
             Step(ids[:, first:prompt], torch.arange(first, prompt).expand(n, -1), slots)]
    steps += [Step(ids[:, prompt + i:prompt + i + 1], (prompt + i + offsets)[:, None], slots) for i in range(STEPS)]
    try:
        logits = [executor.forward_steps(cache, [step])[0] for step in steps]
    finally:
        executor.native_layers = saved
    return [out.flatten() for out in logits], cache


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_K_M"])  # Q4_K_M: q, k 4-bit and v int8, apart
@pytest.mark.parametrize("rows", [(0,), (0, 1, 2), (5, 1, 3)], ids=["one", "block", "scattered"])
def test_native_layers_give_the_python_forwards_bits(zoo, kind, rows):
    llm = LLM(str(zoo.path(f"gguf:llama:{kind}")), dtype="bfloat16", max_batch_size=8, cache_dir=False)
    executor = llm.executor
    assert executor.native_layers is not None
    slots = torch.tensor(rows)
    offsets = torch.tensor([0, 4, 1][:len(rows)])  # rows at positions of their own
    taken, real = [], NativeDecode.run

    def watched(self, *args):
        out = real(self, *args)
        taken.append(out is not None)
        return out

    with mock.patch.object(NativeDecode, "run", watched):
        got, cache = _decode(executor, slots, offsets, native=True)
    # each decode step on the loop; the prompt's chunks too where prompts run on the codes (AVX2)
    assert taken == [executor.native_layers.prompts] * 2 + [True] * STEPS
    want, plain = _decode(executor, slots, offsets, native=False)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(cache.k + cache.v, plain.k + plain.v))


@pytest.mark.parametrize("rows", [(0, 1, 2), (5, 1, 3)], ids=["block", "scattered"])
def test_a_prompt_read_at_one_token_a_row_gives_that_tokens_bits(zoo, rows):
    """A prompt chunk whose logits are read at one token a row (`logit_rows`, a padded row's last real
    token): the last layer finishes those tokens alone, which get the Python forward's logits, and
    every token's keys and values are still written as the Python forward writes them."""
    llm = LLM(str(zoo.path("gguf:llama:Q4_K_M")), dtype="bfloat16", max_batch_size=8, cache_dir=False)
    executor = llm.executor
    if not executor.native_layers.prompts:
        pytest.skip("prompts run the Python forward here (a fast dense GEMM for bf16)")
    slots, n = torch.tensor(rows), len(rows)
    ids = torch.randint(3, 200, (n, 14), generator=torch.Generator().manual_seed(1))
    step = Step(ids, torch.arange(14).expand(n, -1), slots, logit_rows=torch.tensor([13, 6, 0]))
    kept, real = [], DecodeLayers.run

    def watched(self, kernels, native_step, *args):
        kept.append(native_step.keep)  # the kept tokens' address, handed to the C loop
        return real(self, kernels, native_step, *args)

    caches, logits = [], []
    for native in (True, False):
        saved, executor.native_layers = executor.native_layers, executor.native_layers if native else None
        try:
            caches.append(executor.new_cache(8, 16))
            with mock.patch.object(DecodeLayers, "run", watched):
                logits.append(executor.forward_steps(caches[-1], [step])[0])
        finally:
            executor.native_layers = saved
    assert len(kept) == 1 and kept[0]
    assert logits[0].shape == (n, 1, logits[0].shape[-1]) and torch.equal(logits[0], logits[1])
    assert all(torch.equal(a, b) for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v))


def test_two_threads_give_one_threads_bits(zoo):
    """A prompt of 8 x 40 tokens: the loop's own passes (rotation, adds, copies) split over two
    threads from 256 tokens, the kernels over theirs; the bits are the Python forward's on one."""
    llm = LLM(str(zoo.path("gguf:llama:Q4_0")), dtype="bfloat16", max_batch_size=8, cache_dir=False)
    slots, offsets = torch.arange(8), torch.zeros(8, dtype=torch.long)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got, cache = _decode(llm.executor, slots, offsets, native=True, prompt=40)
        torch.set_num_threads(1)
        want, plain = _decode(llm.executor, slots, offsets, native=False, prompt=40)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(cache.k + cache.v, plain.k + plain.v))


def test_a_float32_model_and_a_model_off_the_kernels_run_the_python_forward(zoo):
    fp32 = LLM(str(zoo.path("gguf:llama:Q4_0")), dtype="float32", max_batch_size=2, cache_dir=False)
    assert fp32.executor.native_layers is None
    dense = LLM(str(zoo.path("tiny:llama_gqa")), dtype="bfloat16", max_batch_size=2, cache_dir=False)
    assert dense.executor.native_layers is None



def test_the_rotation_is_rotate_half_splits_on_every_head_size_the_loop_holds():
    """Each head of a token rotated by its tables (`rotate_heads`): whole-vector halves (the tables
    converted once) up to the loop's largest head (512), and halves of a partial vector (head size
    8; the loader checks 16-80), bit for bit `rotate_half_split`'s ops in bf16; a larger head is
    refused (the C loop's buffers hold 512)."""
    loop = loader.chosen().get("decode_layers")
    if loop is None:
        pytest.skip("the native decode loop does not run here")
    gen = torch.Generator().manual_seed(2)
    for d in (8, 16, 64, 128, 256, 512):
        x, cos, sin = ((torch.randn(n, d, generator=gen) * 4).bfloat16() for n in (7, 1, 1))
        want = (x * cos).add_(x.roll(d // 2, -1).mul_(sin))
        assert torch.equal(loop.rotate(x, cos[0], sin[0]), want), d
    x = torch.zeros(2, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head size 1024"):
        loop.rotate(x, x[0], x[0])
