"""Generation semantics on a tiny random model: batching, stop strings, EOS, log-probs, scoring."""

import pytest
import torch

from flexlamps import LLM, SamplingParams
from flexlamps.engine.caches.dense import DenseKVCache
from flexlamps.engine.executors.step import Step


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), max_batch_size=3)


PROMPTS = ["hello", "the quick brown fox jumps over the lazy dog", "numbers 1 2 3 4", "a", "Once upon a time there was"]


def test_mixed_length_batch_equals_each_prompt_alone(llm):
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (5, 12, 3, 9, 7)]
    together = llm.generate(PROMPTS, params)  # 5 prompts over 3 slots: slots get reused
    for prompt, p, out in zip(PROMPTS, params, together):
        alone = llm.generate([prompt], p)[0]
        assert out.token_ids == alone.token_ids
        assert len(out.token_ids) == p.max_new_tokens and out.finish_reason == "length"


def test_logprobs_equal_a_full_forward(llm):
    out = llm.generate([PROMPTS[1]], SamplingParams(max_new_tokens=6, logprobs=True, ignore_eos=True))[0]
    ids = llm.tokenizer.encode(PROMPTS[1]) + out.token_ids
    n = len(ids)
    cache = DenseKVCache(llm.config, 1, n, torch.float32)
    logits = llm.executor.forward_steps(cache, [Step(torch.tensor([ids]), torch.arange(n)[None], torch.tensor([0]))])[0]
    logp = torch.log_softmax(logits[0], -1)
    p = len(ids) - len(out.token_ids)
    expected = [float(logp[p - 1 + j, t]) for j, t in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_stop_strings_cut_the_text(llm):
    free = llm.generate([PROMPTS[0]], SamplingParams(max_new_tokens=16, ignore_eos=True))[0]
    assert len(free.text) > 4
    stop = free.text[2:4]
    out = llm.generate([PROMPTS[0]], SamplingParams(max_new_tokens=16, ignore_eos=True, stop=("zzzz", stop)))[0]
    assert out.finish_reason == "stop" and out.stop_string == stop
    assert out.text == free.text[: free.text.find(stop)]


def test_eos_ends_generation(llm, monkeypatch):
    free = llm.generate(["hello"], SamplingParams(max_new_tokens=6, ignore_eos=True))[0]
    eos = free.token_ids[3]  # declare the 4th greedy token to be EOS: generation must stop there
    monkeypatch.setattr(llm.tokenizer, "eos_token_ids", (eos,))
    out = llm.generate(["hello"], SamplingParams(max_new_tokens=6))[0]
    cut = free.token_ids.index(eos)
    assert out.finish_reason == "eos" and out.token_ids == free.token_ids[: cut + 1]
    assert out.text == llm.tokenizer.decode(free.token_ids[:cut])


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


def test_greedy_tokens_is_torch_argmax():
    from flexlamps.engine.batch.sampling import greedy_tokens

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 2, 1000, generator=gen)[:, 1]  # a strided view, as logits[:, 0] is
    logits[1, 10], logits[1, 20] = float("nan"), float("nan")  # a NaN counts as the maximum
    logits[2] = 0.5  # ties: the first
    logits[3, 7], logits[3, 900] = float("inf"), float("inf")
    assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
    assert torch.equal(greedy_tokens(logits.to(torch.bfloat16)), logits.to(torch.bfloat16).argmax(-1))


def _direct_logprob(llm, context, continuation):
    from flexlamps.engine.batch.scoring import split_tokens

    ctx, cont = split_tokens(llm.tokenizer, context, continuation)
    ids = ctx + cont
    cache = DenseKVCache(llm.config, 1, len(ids), torch.float32)
    logits = llm.executor.forward_steps(cache, [Step(torch.tensor([ids]), torch.arange(len(ids))[None],
                                                    torch.tensor([0]))])[0]
    logp = torch.log_softmax(logits[0], -1)
    return sum(float(logp[len(ctx) - 1 + j, t]) for j, t in enumerate(cont)), len(cont)


def test_score_with_prefix_reuse_equals_direct_computation(tiny_llama):
    shared = "the quick brown fox jumps over the lazy dog. hello world. "
    contexts = [shared + q for q in ("numbers 1 2", "numbers 1 2", "Once upon", "Once upon", "a tiny")]
    conts = [" 3", " 4 5", " a time", " the model", " model"]
    with_reuse = LLM(str(tiny_llama), reuse_prefix=True)
    without = LLM(str(tiny_llama), reuse_prefix=False)
    a = with_reuse.score(contexts, conts)
    b = without.score(contexts, conts)
    for ctx, cont, x, y in zip(contexts, conts, a, b):
        lp, n = _direct_logprob(without, ctx, cont)
        assert x.num_tokens == y.num_tokens == n
        assert x.logprob == pytest.approx(lp, abs=1e-4) and y.logprob == pytest.approx(lp, abs=1e-4)
    assert with_reuse.stats.prefill_tokens_requested == without.stats.prefill_tokens_requested
    assert with_reuse.stats.prefill_tokens_computed < 0.6 * without.stats.prefill_tokens_computed


def test_score_matches_transformers(tiny_llama):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    llm = LLM(str(tiny_llama))
    from flexlamps.engine.batch.scoring import split_tokens

    for ctx, cont in [("Question: hello world\nAnswer:", " the quick"), ("numbers 1 2", " 3 4")]:
        c, k = split_tokens(llm.tokenizer, ctx, cont)
        with torch.no_grad():
            logp = torch.log_softmax(ref(torch.tensor([c + k])).logits[0], -1)
        expected = sum(float(logp[len(c) - 1 + j, t]) for j, t in enumerate(k))
        assert llm.score([ctx], [cont])[0].logprob == pytest.approx(expected, abs=1e-3)


def test_generation_with_shared_prefix_equals_no_reuse(tiny_llama):
    shared = "the quick brown fox jumps over the lazy dog. hello world. numbers 1 2 3 4 5 6 7 8 9. "
    prompts = [shared + q for q in ("Once upon", "a tiny", "hello", "the quick brown")]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    reuse = LLM(str(tiny_llama), max_batch_size=2, reuse_prefix=True)
    plain = LLM(str(tiny_llama), max_batch_size=2, reuse_prefix=False)
    a = reuse.generate(prompts, params)
    b = plain.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert reuse.stats.prefill_tokens_requested == plain.stats.prefill_tokens_requested
    assert reuse.stats.prefill_tokens_computed < 0.5 * plain.stats.prefill_tokens_computed


def test_shared_prefix_with_offloaded_compressed_cache(tiny_llama):
    from placement import Policy, TierSplit

    g = TierSplit(gpu=1, cpu=0, disk=0)
    shared = "the quick brown fox jumps over the lazy dog. hello world. numbers 1 2 3 4 5 6 7 8 9. "
    prompts = [shared + q for q in ("Once upon", "a tiny", "hello")]
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=g, cache=TierSplit(gpu=0, cpu=1, disk=0),
                    activations=g, compress_cache=True)
    outs = {}
    for reuse in (True, False):
        llm = LLM(str(tiny_llama), gpu_mem="64MiB", cpu_mem="64MiB", policy=policy, reuse_prefix=reuse)
        outs[reuse] = [o.token_ids for o in llm.generate(prompts, params)]
        assert llm.executor.budgets["gpu"].used_bytes == sum(
            t.numel() * t.element_size() for n, t in llm.executor.store._resident.items()
            if llm.executor.store.tier_of(n) == "gpu")  # every cache freed
    agree = sum(x == y for a, b in zip(outs[True], outs[False]) for x, y in zip(a, b))
    assert agree >= 0.75 * sum(len(a) for a in outs[True])  # lossy cache: copies of a prefix, not bit-equal
