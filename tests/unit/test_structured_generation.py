"""JSON-schema constrained decoding, n samples sharing a prefill, top log-probs and `LLM.chat`,
on a tiny random model (its tokenizer is byte-level BPE: any JSON text can be spelled)."""

import json

import jsonschema
import numpy as np
import pytest
import torch

from flexlamps import LLM, SamplingParams
from flexlamps.engine.batch.grammar import GrammarError, mask_rows
from flexlamps.engine.batch.sampling import top_tokens
from flexlamps.io.records import canonical_schema

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                                     "zip": {"type": "integer", "minimum": 0, "maximum": 999}},
                    "required": ["city", "zip"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False},
    "array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]}, "ok": {"type": "boolean"}},
        "required": ["label", "ok"], "additionalProperties": False},
    "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 4},
}
PROMPTS = ["hello", "the quick brown fox jumps over the lazy dog", "numbers 1 2 3 4", "a"]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), max_batch_size=3)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_greedy_constrained_output_parses_and_validates(llm, name):
    params = SamplingParams(max_new_tokens=120, json_schema=canonical_schema(SCHEMAS[name]))
    for out in llm.generate(PROMPTS, params):
        assert out.finish_reason == "eos", (out.text, out.finish_reason)
        jsonschema.validate(json.loads(out.text), SCHEMAS[name])


def test_unconstrained_rows_are_untouched_and_constrained_rows_batch_invariant(llm):
    schema = canonical_schema(SCHEMAS["enum"])
    free = SamplingParams(max_new_tokens=8, ignore_eos=True)
    bound = SamplingParams(max_new_tokens=40, json_schema=schema)
    mixed = llm.generate(PROMPTS, [bound, free, bound, free])
    for prompt, p, out in zip(PROMPTS, [bound, free, bound, free], mixed):
        assert out.token_ids == llm.generate([prompt], p)[0].token_ids


def test_sampled_constrained_output_validates(llm):
    params = SamplingParams(max_new_tokens=120, temperature=1.0, seed=3, n=3, json_schema=canonical_schema(SCHEMAS["array"]))
    for out in llm.generate(PROMPTS[:2], params):
        jsonschema.validate(json.loads(out.text), SCHEMAS["array"])


def test_max_tokens_before_the_value_closes_is_length(llm):
    out = llm.generate(["hello"], SamplingParams(max_new_tokens=3, json_schema=canonical_schema(SCHEMAS["nested"])))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_a_schema_the_library_cannot_compile_is_a_grammar_error(llm):
    with pytest.raises(GrammarError):
        llm.grammars.compile(canonical_schema({"type": "object", "properties": {"a": {"type": "no-such-type"}}}))
    with pytest.raises(GrammarError):
        llm.grammars.compile("{not json")


def test_n_samples_share_the_prefill_and_equal_separate_prompts(tiny_llama):
    llm = LLM(str(tiny_llama), max_batch_size=4)
    prompt = "Once upon a time there was a model"
    params = SamplingParams(max_new_tokens=6, temperature=0.9, seed=7, n=3, ignore_eos=True)
    outs = llm.generate([prompt, "hello"], params)
    assert [(o.index, o.sample) for o in outs] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert len({tuple(o.token_ids) for o in outs[:3]}) > 1  # the samples differ
    before = llm.stats.prefill_tokens_computed
    again = llm.generate([prompt], params)  # alone, in another batch: the same samples
    assert [o.token_ids for o in again] == [o.token_ids for o in outs[:3]]
    length = len(llm.tokenizer.encode(prompt))
    assert llm.stats.prefill_tokens_computed - before == length - 1 + 3  # once, then one token a sample
    no_reuse = LLM(str(tiny_llama), max_batch_size=2, reuse_prefix=False).generate([prompt], params)
    greedy = llm.generate([prompt], SamplingParams(max_new_tokens=6, n=2, ignore_eos=True))
    assert greedy[0].token_ids == greedy[1].token_ids
    assert greedy[0].token_ids == llm.generate([prompt], SamplingParams(max_new_tokens=6, ignore_eos=True))[0].token_ids
    assert [o.sample for o in no_reuse] == [0, 1, 2]


def test_top_logprobs_rank_the_chosen_greedy_token_first(llm):
    out = llm.generate(["hello"], SamplingParams(max_new_tokens=4, logprobs=True, top_logprobs=3, ignore_eos=True))[0]
    assert len(out.top_logprobs) == 4
    for token, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
        assert len(top) == 3 and top[0][0] == token and top[0][1] == pytest.approx(lp)
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_chat_equals_generate_with_chat(llm):
    convo = [{"role": "user", "content": "hello there"}]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    assert llm.chat([convo], params)[0].token_ids == llm.generate(["hello there"], params, chat=True)[0].token_ids
    system = [{"role": "system", "content": "be brief"}, *convo]
    assert llm.encode_chat(system) != llm.encode_chat(convo)
    with pytest.raises(TypeError):
        llm.chat(convo, params)


def test_properties_come_in_the_schemas_order(llm):
    schema = {"type": "object", "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "boolean"}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    out = llm.generate(["hello"], SamplingParams(max_new_tokens=40, json_schema=canonical_schema(schema)))[0]
    assert out.text.startswith('{"zeta":') and list(json.loads(out.text)) == ["zeta", "alpha"]


class _Bits:
    """A grammar stand-in allowing fixed tokens."""
    vocab_size = 64

    def __init__(self, allowed):
        self.bits = np.zeros(self.vocab_size, dtype=np.uint8)
        self.bits[allowed] = 1

    def fill_mask(self, words):
        words[:] = np.packbits(self.bits, bitorder="little").view(np.int32)


def test_mask_rows_blocks_only_the_disallowed_tokens_of_the_constrained_rows():
    with torch.inference_mode():  # as the executors return them: a strided view of an inference tensor
        base = torch.randn(3, 2, 60)
    before = base.clone()
    mask_rows(base[:, 0], [0, 2], [_Bits([1, 5, 59]), _Bits([0])])
    assert torch.isfinite(base[0, 0]).nonzero().flatten().tolist() == [1, 5, 59]
    assert torch.isfinite(base[2, 0]).nonzero().flatten().tolist() == [0]
    assert torch.equal(base[1], before[1]) and torch.equal(base[:, 1], before[:, 1])
    assert torch.equal(base[0, 0, [1, 5, 59]], before[0, 0, [1, 5, 59]])


def test_top_tokens_order_ties_by_token_id_whatever_the_rows_beside():
    """The most likely tokens of a row, equal log-probabilities by the lower id (torch.topk lists
    [0, 1, 1, 1, 0.5]'s two best as ids 1, 3), the same alone and beside other rows."""
    row = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5])
    values, ids = top_tokens(row[None], 2)
    assert ids.tolist() == [[1, 2]] and values.tolist() == [[1.0, 1.0]]
    assert top_tokens(row[None], 5)[1].tolist() == [[1, 2, 3, 4, 0]]
    torch.manual_seed(0)
    block = torch.randn(6, 49152)
    block[:, [100, 200, 300]] = block.max() + 1
    block[3] = torch.randn(49152)
    values, ids = top_tokens(block, 4)
    for r in range(6):
        alone = top_tokens(block[r:r + 1], 4)
        assert torch.equal(alone[1][0], ids[r]) and torch.equal(alone[0][0], values[r])
    assert ids[0, :3].tolist() == [100, 200, 300]
    assert torch.equal(values[3], torch.topk(block[3], 4).values)
