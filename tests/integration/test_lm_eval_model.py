"""`FlexlampsLM` (lm_eval's model interface on the engine) answers lm_eval's three request kinds
as lm_eval's HF backend does on the same weights: a tiny random LLaMA, HFLM over transformers as
the reference, in memory and offloaded to disk."""

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm_eval is the optional extra flexlamps[eval]")

from lm_eval.api.instance import Instance  # noqa: E402

from flexlamps.api import LLM, RunSettings  # noqa: E402
from flexlamps.evals.lm_eval_jobs import Engines, PartCost, score_chunks, truncate_pair  # noqa: E402
from flexlamps.evals.lm_eval_model import FlexlampsLM  # noqa: E402

MAX_LENGTH = 24  # short, so rolling windows and truncation really happen

PAIRS = [("the quick brown fox", " jumps over the lazy dog"), ("the quick brown fox", " is a number"),
         ("numbers 0 1 2", " 3 4 5"), ("", "hello world"), ("Once upon a time there was ", "a model"),
         # longer than MAX_LENGTH + 1 tokens: truncated from the left, as HFLM truncates
         ("the quick brown fox jumps over the lazy dog " * 3, "hello world, this is a tiny tokenizer")]
DOCS = ["the quick brown fox jumps over the lazy dog. " * 4 + "Once upon a time.", "hello world", "",
        "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation !?.,;: " * 2]
GENERATIONS = [("the quick brown", {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}),
               ("hello world, this is", {"until": ["o"], "max_gen_toks": 8}),
               ("numbers 0 1 2 3", {"until": [], "max_gen_toks": 3, "temperature": 0.0}),
               ("the quick brown", {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False})]


def _instances(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """lm_eval's HF backend on the same checkpoint (its tokenizer told to add the BOS, as the
    checkpoint's tokenizer_config says and flexlamps' tokenizer does)."""
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tiny_llama, add_bos_token=True)
    hf = HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=MAX_LENGTH, device="cpu")
    return {"loglikelihood": hf.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True),
            "rolling": hf.loglikelihood_rolling(_instances("loglikelihood_rolling", [(d,) for d in DOCS]),
                                                disable_tqdm=True),
            "generate": hf.generate_until(_instances("generate_until", GENERATIONS), disable_tqdm=True)}


def _check(lm, reference):
    ll = lm.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    assert [g for _, g in ll] == [g for _, g in reference["loglikelihood"]]
    assert [lp for lp, _ in ll] == pytest.approx([lp for lp, _ in reference["loglikelihood"]], abs=1e-4)
    rolling = lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(d,) for d in DOCS]), disable_tqdm=True)
    assert rolling == pytest.approx(reference["rolling"], abs=1e-3)
    assert lm.generate_until(_instances("generate_until", GENERATIONS), disable_tqdm=True) == reference["generate"]


def test_the_three_request_kinds_equal_lm_evals_hf_backend(tiny_llama, reference):
    lm = FlexlampsLM(str(tiny_llama), dtype="float32", max_length=MAX_LENGTH, chunk_tokens=40, progress=False)
    _check(lm, reference)
    assert len(lm.tok_encode(DOCS[0])) > 2 * MAX_LENGTH  # the first document takes three windows


def test_offloaded_to_disk_equals_lm_evals_hf_backend(tmp_path, tiny_llama, reference):
    from placement import Policy, TierSplit

    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=TierSplit(gpu=0.2, cpu=0.3, disk=0.5),
                    cache=TierSplit(gpu=0, cpu=1, disk=0), activations=TierSplit(gpu=1, cpu=0, disk=0))
    pfile = tmp_path / "policy.json"
    pfile.write_text(policy.to_json())
    lm = FlexlampsLM(str(tiny_llama), dtype="float32", max_length=MAX_LENGTH, progress=False, gpu_mem="4MiB",
                     cpu_mem="64MiB", offload_dir=str(tmp_path / "offload"), policy=str(pfile))
    try:
        _check(lm, reference)
    finally:
        lm.close()
    assert any((tmp_path / "offload").iterdir())  # weights really went to the disk tier


def test_it_runs_on_the_llm_it_is_given(tiny_llama, reference):
    llm = LLM.from_settings(RunSettings.parse(str(tiny_llama), dtype="float32"), prepare=False)
    lm = FlexlampsLM(llm=llm, max_length=MAX_LENGTH, progress=False)
    assert lm.engines.for_kind("score") is llm and lm.settings is llm.settings
    ll = lm.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    assert [lp for lp, _ in ll] == pytest.approx([lp for lp, _ in reference["loglikelihood"]], abs=1e-4)


class _PlannedLLM:
    """An LLM as `Engines` sees it: its settings, its executor once planned, `replan`."""

    def __init__(self, offloaded: bool, policy):
        self.settings = type("Settings", (), {"offloaded": offloaded, "policy": policy})()
        self.executor, self.replans = None, 0

    def replan(self):
        self.executor, self.replans = None, self.replans + 1


@pytest.mark.parametrize("offloaded,policy,replans", [(True, "auto", 1), (True, "policy.json", 0), (False, "auto", 0)])
def test_another_request_kind_replans_only_an_auto_placed_engine(offloaded, policy, replans):
    """One LLM answers every kind; an offloaded one placed by "auto" plans again for the second
    kind's workload, once it has planned for the first."""
    llm = _PlannedLLM(offloaded, policy)
    engines = Engines(llm)
    for kind in ("score", "score", "generate", "generate"):
        assert engines.for_kind(kind) is llm
        llm.executor = object()  # the kind's call planned and built it
    assert llm.replans == replans


def test_replan_forgets_the_plan_and_the_next_call_plans_again(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32")
    first = llm.score(["the quick brown fox"], [" jumps"])[0].logprob
    llm.replan()
    assert llm.executor is None and llm.run_plan is None
    assert llm.score(["the quick brown fox"], [" jumps"])[0].logprob == first and llm.executor is not None


def test_a_generation_keyword_the_engine_lacks_is_named(tiny_llama):
    lm = FlexlampsLM(str(tiny_llama), progress=False)
    with pytest.raises(ValueError, match="repetition_penalty are not supported"):
        lm.generate_until(_instances("generate_until", [("hello", {"max_gen_toks": 4, "repetition_penalty": 1.1})]))
    with pytest.raises(ValueError, match="max_gen_toks 256 leaves no room for the prompt in max_length 128"):
        lm.generate_until(_instances("generate_until", [("hello", {"until": []})]))


def test_truncation_keeps_the_continuation_and_the_last_tokens():
    assert truncate_pair([1, 2, 3, 4, 5], [6, 7], 4) == ([3, 4, 5], [6, 7])
    assert truncate_pair([1, 2], [3], 4) == ([1, 2], [3])
    with pytest.raises(ValueError, match="longer than max_length 2"):
        truncate_pair([1], [2, 3, 4], 2)


def test_parts_hold_about_chunk_tokens_and_at_least_one_index():
    pairs = [[([1] * 5, [2] * 5)], [([1] * 30, [2])], [([1], [2])], [([1], [2])]]
    assert list(score_chunks([0, 1, 2, 3], pairs, 12)) == [[0], [1], [2, 3]]


def test_a_part_counts_its_shared_root_once_and_ends_where_the_root_would_be_lost():
    first, second = [7] * 200, [8] * 200  # two subjects' few-shot examples
    pairs = [[(first + [i], [3])] for i in range(4)] + [[(second + [i], [3])] for i in range(4)]
    assert PartCost().plus(pairs[0]).plus(pairs[1]).tokens == 200 + 2 * 1 + 2 * 1  # root, contexts past it, choices
    assert PartCost().plus(pairs[0]).plus(pairs[0]).tokens == 201 + 2  # one context under two choices: fed once
    assert list(score_chunks(range(8), pairs, 1024)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(score_chunks(range(8), pairs, 60)) == [[0], [1], [2], [3], [4], [5], [6], [7]]
