"""Several samples of a prompt (`n > 1`) share its prefill and run its last token on their own:
as a prompt, so each sample's tokens and log-probs are the bits the prompt run with n = 1 gives,
on a CPU whose prompts take another kernel than decode too (emulated: the kinds told the dense
GEMM is fast here, so a 4-bit GGUF's prompts run the int8 GEMM and its decode the fused kernel)."""

from unittest import mock

import pytest

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.models.blocks import coded_weights
from tests.checkpoint_zoo import CheckpointZoo


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from flexlamps import LLM

    zoo = CheckpointZoo(tmp_path_factory.mktemp("samples_zoo"))
    llm = LLM(str(zoo.path("gguf:llama:Q4_0")), dtype="bfloat16", max_batch_size=4, cache_dir=False)
    llm.prepare(prompt_len=24, gen_len=4, num_sequences=4, prefix_len=0)
    yield llm
    llm.close()


@pytest.mark.parametrize("prompts_run_other_kernels", [False, True])
def test_each_sample_is_the_single_samples_bits(llm, prompts_run_other_kernels):
    prompt = list(range(5, 23))
    params = dict(max_new_tokens=4, ignore_eos=True, logprobs=True)
    with mock.patch.object(coded_weights, "fast_dense_gemm", lambda x: prompts_run_other_kernels or x.device.type != "cpu"):
        one = generate(llm.executor, llm.tokenizer, [prompt], [SamplingParams(**params)], max_batch=4)[0]
        two = generate(llm.executor, llm.tokenizer, [prompt], [SamplingParams(n=2, **params)], max_batch=4)
    assert len(two) == 2
    for sample in two:
        assert (sample.token_ids, sample.logprobs) == (one.token_ids, one.logprobs)
