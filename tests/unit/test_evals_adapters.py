"""Adapters: prompt text exactly as HELM / lighteval build it, and HELM's seeded example choice."""

import pytest

from flexlamps.evals.adapter_spec import (
    cloze_spec,
    generation_spec,
    multiple_choice_joint_spec,
    multiple_choice_separate_spec,
)
from flexlamps.evals.adapters import adapt, build_prompt, example_block, sample_examples, split_document
from flexlamps.evals.instances import CORRECT_TAG, TRAIN_SPLIT, Instance, Reference, mc_instance


def _qa(q, a, split="test"):
    return Instance(q, [Reference(a, [CORRECT_TAG])], split)


def test_generation_prompt_text():
    spec = generation_spec(instructions="Answer briefly.", input_noun="Question", output_noun="Answer",
                           max_train_instances=2)
    examples = [_qa("Capital of France?", "Paris", TRAIN_SPLIT), _qa("Days in a week?", "Seven", TRAIN_SPLIT)]
    p = build_prompt(spec, examples, example_block(spec, _qa("Capital of Italy?", "Rome"), include_output=False))
    assert p.text == ("Answer briefly.\n\n"
                      "Question: Capital of France?\nAnswer: Paris\n\n"
                      "Question: Days in a week?\nAnswer: Seven\n\n"
                      "Question: Capital of Italy?\nAnswer:")
    assert p.shared == p.text[: p.text.index("Question: Capital of Italy")]
    assert p.num_train_instances == 2


def test_mmlu_joint_prompt_text():
    spec = multiple_choice_joint_spec("The following are multiple choice questions (with answers) about anatomy.",
                                      "Question", "Answer")
    ex = mc_instance("Q1?", ["a", "b", "c", "d"], 1, TRAIN_SPLIT)
    ev = mc_instance("Q2?", ["w", "x", "y", "z"], 3)
    (state,) = adapt(spec, [ex, ev])
    assert state.request.prompt == (
        "The following are multiple choice questions (with answers) about anatomy.\n\n"
        "Question: Q1?\nA. a\nB. b\nC. c\nD. d\nAnswer: B\n\n"
        "Question: Q2?\nA. w\nB. x\nC. y\nD. z\nAnswer:")
    assert state.output_mapping == {"A": "w", "B": "x", "C": "y", "D": "z"}
    assert state.request.max_tokens == 1 and state.request.stop_sequences == []


def test_cloze_is_lighteval_cf():
    states = adapt(cloze_spec(), [mc_instance("Which is a mammal?", ["Shark", "Whale"], 1)])
    assert [s.context for s in states] == ["Question: Which is a mammal?\nAnswer:"] * 2
    assert [s.continuation for s in states] == [" Shark", " Whale"]
    assert states[1].request.prompt == "Question: Which is a mammal?\nAnswer: Whale"
    assert [s.reference_index for s in states] == [0, 1]


def test_cloze_few_shot_separator_is_a_blank_line():
    ex = mc_instance("Q1?", ["x", "y"], 0, TRAIN_SPLIT)
    states = adapt(cloze_spec(max_train_instances=1), [ex, mc_instance("Q2?", ["u", "v"], 1)])
    assert states[0].context == "Question: Q1?\nAnswer: x\n\nQuestion: Q2?\nAnswer:"


def test_separate_is_input_space_reference():
    states = adapt(multiple_choice_separate_spec(), [mc_instance("The sky is", ["blue", "green"], 0)])
    assert [(s.context, s.continuation) for s in states] == [("The sky is", " blue"), ("The sky is", " green")]


def test_example_choice_is_seeded_and_label_balanced():
    train = [_qa(f"q{i}", "yes" if i < 6 else "no", TRAIN_SPLIT) for i in range(8)]
    a = sample_examples(train, 4, seed=0)
    assert a == sample_examples(train, 4, seed=0)
    assert sorted(x.first_correct_reference.text for x in a) == ["no", "no", "yes", "yes"]
    seeds = {tuple(x.input for x in sample_examples(train, 4, seed=s)) for s in range(6)}
    assert len(seeds) > 1  # the seed matters


def test_prompt_too_long_drops_examples_then_truncates():
    spec = generation_spec(input_noun="Q", output_noun="A", max_train_instances=3)
    examples = [_qa("x" * 50, "y", TRAIN_SPLIT) for _ in range(3)]
    block = example_block(spec, _qa("short?", "z"), include_output=False)
    p = build_prompt(spec, examples, block, fits=lambda t: len(t) <= 80)
    assert p.num_train_instances == 1 and not p.truncated
    p = build_prompt(spec, examples, block, fits=lambda t: len(t) <= 5)
    assert p.truncated and p.text == "Q: sh" and p.num_train_instances == 0


def test_split_document_keeps_text():
    text = "line one\nline two is longer\n" * 50
    pieces = split_document(text, 100)
    assert "".join(pieces) == text and max(map(len, pieces)) <= 100


# --- the same prompts from crfm-helm's own adapter code, when it is installed -----------------

def _helm():
    pytest.importorskip("helm.benchmark.adaptation.adapters.multiple_choice_joint_adapter",
                        reason="crfm-helm is not installed")
    from helm.benchmark.adaptation import adapter_spec as hspec
    from helm.benchmark.adaptation.adapters.multiple_choice_joint_adapter import MultipleChoiceJointAdapter
    from helm.benchmark.adaptation.prompt import Prompt
    from helm.benchmark.scenarios import scenario as hs

    return hspec, MultipleChoiceJointAdapter, Prompt, hs


def _to_helm(hs, inst):
    refs = [hs.Reference(hs.Output(text=r.text), tags=list(r.tags)) for r in inst.references]
    return hs.Instance(hs.Input(text=inst.input), references=refs, split=inst.split)


def test_matches_helm_adapter_code():
    hspec, Joint, HelmPrompt, hs = _helm()
    ours = multiple_choice_joint_spec("About anatomy.", "Question", "Answer", max_train_instances=3)
    theirs = hspec.AdapterSpec(**{k: v for k, v in ours.to_json().items()
                                  if k in hspec.AdapterSpec.__dataclass_fields__})
    adapter = Joint.__new__(Joint)  # skip __init__: it wants a tokenizer service for window fitting
    adapter.adapter_spec = theirs
    train = [mc_instance(f"Q{i}?", ["a", "b", "c", "d"], i % 4 if i < 7 else 0, TRAIN_SPLIT) for i in range(9)]
    ev = mc_instance("Final?", ["p", "q", "r"], 2)
    h_train = [_to_helm(hs, t) for t in train]
    for seed in range(4):
        picked = adapter.sample_examples(h_train, seed=seed)
        assert [p.input.text for p in picked] == [x.input for x in sample_examples(train, 3, seed)]
    picked = sample_examples(train, 3, 0)
    helm_prompt = HelmPrompt(global_prefix="", global_suffix="", instance_prefix=theirs.instance_prefix,
                             substitutions=[], instructions_block=theirs.instructions,
                             train_instance_blocks=[adapter.construct_example_prompt(_to_helm(hs, x), True, None)
                                                    for x in picked],
                             eval_instance_block=adapter.construct_example_prompt(_to_helm(hs, ev), False, None))
    (state,) = adapt(ours, train + [ev])
    assert state.request.prompt == helm_prompt.text
