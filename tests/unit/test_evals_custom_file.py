"""The documented format of a user's own evaluation file: kinds, settings, ids, and clear errors."""

import json

import pytest

from flexlamps.evals.adapters import adapt
from flexlamps.evals.custom_file import CustomFileError, load_custom_file
from flexlamps.evals.run_specs import build_run_spec


def _write(tmp_path, rows, name="mine.jsonl"):
    f = tmp_path / name
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return f


def _states(f, **overrides):
    loaded = load_custom_file(f, overrides=overrides)
    loaded.scenario.assign_ids()
    spec = build_run_spec(("file", {"path": str(f), "name": f.stem}), "flexlamps/m", file_settings=loaded.settings)
    return spec, adapt(spec.adapter_spec, loaded.scenario.instances)


def test_multiple_choice_default_is_context_space_ending(tmp_path):
    f = _write(tmp_path, [{"id": "hs-17", "query": "A man sits down. He", "choices": ["eats.", "flies."], "gold": "0"}])
    spec, states = _states(f)
    assert [(s.context, s.continuation) for s in states] == [("A man sits down. He", " eats."),
                                                            ("A man sits down. He", " flies.")]
    assert states[0].instance.id == "hs-17" and spec.main_metric == "mc_accuracy_char_norm"
    assert spec.name == "file:name=mine,model=flexlamps_m" and spec.groups == ["custom_mine"]


def test_quiz_template_on_request_and_metric_per_file(tmp_path):
    f = _write(tmp_path, [{"settings": {"prompt_template": "quiz", "metric": "acc"}},
                          {"context": "2+2?", "choices": ["3", "4"], "gold": 1}])
    spec, states = _states(f)
    assert states[1].context == "Question: 2+2?\nAnswer:" and states[1].continuation == " 4"
    assert spec.main_metric == "mc_accuracy_raw" and "template=quiz" in spec.name
    spec, states = _states(f, prompt_template="Q: {context}\nA:", metric="acc_norm_tokens")
    assert states[0].context == "Q: 2+2?\nA:" and spec.main_metric == "mc_accuracy_token_norm"


def test_partial_scoring_one_context_per_choice(tmp_path):
    f = _write(tmp_path, [{"id": 7, "contexts": ["Ian ate because Ian", "Ian ate because Dennis"],
                           "continuation": "was hungry.", "gold": 0}])
    spec, states = _states(f)
    assert [(s.context, s.continuation) for s in states] == [("Ian ate because Ian", " was hungry."),
                                                            ("Ian ate because Dennis", " was hungry.")]
    assert spec.adapter_spec.method == "multiple_choice_partial" and spec.main_metric == "mc_accuracy_raw"
    assert states[0].instance.id == "7"


def test_generation_prompt_references_and_settings(tmp_path):
    f = _write(tmp_path, [{"settings": {"metric": "f1", "max_tokens": 5, "stop": ["."]}},
                          {"prompt": "Capital of Peru?", "references": ["Lima", "Lima city"]},
                          {"input": "Capital of Chile?", "answer": "Santiago"}])
    spec, states = _states(f)
    assert states[0].request.prompt == "Capital of Peru?" and states[0].request.max_tokens == 5
    assert states[0].request.stop_sequences == ["."] and spec.main_metric == "f1_score"
    assert [r.text for r in states[1].instance.references] == ["Santiago"]


def test_in_context_examples_from_train_lines(tmp_path):
    f = _write(tmp_path, [{"context": "1+1?", "choices": ["2", "3"], "gold": 0, "split": "train"},
                          {"context": "2+2?", "choices": ["4", "5"], "gold": 0}])
    loaded = load_custom_file(f)
    loaded.scenario.assign_ids()
    spec = build_run_spec(("file", {"path": str(f), "name": "mine"}), "flexlamps/m", num_shots=1,
                          file_settings=loaded.settings)
    states = adapt(spec.adapter_spec, loaded.scenario.instances)
    assert states[0].context == "1+1? 2\n\n2+2?"


@pytest.mark.parametrize("rows,message", [
    ([{"context": "x", "choices": ["a", "b"], "gold": 3}], "gold must be the index"),
    ([{"context": "x", "choices": ["a", "b"], "gold": 0, "label": 1}], "unknown field(s) label"),
    ([{"context": "x", "gold": 0}], "exactly one of 'choices'"),
    ([{"context": "x", "choices": ["a", "b"], "gold": 0}, {"prompt": "y", "references": "z"}],
     "this line is generation but line 1 is multiple_choice"),
    ([{"settings": {"metric": "bleu"}}, {"context": "x", "choices": ["a", "b"], "gold": 0}], "metric 'bleu'"),
    ([{"settings": {"method": "separate"}}, {"context": "x", "choices": ["a", "b"], "gold": 0}],
     "unknown setting(s) method"),
    ([{"settings": {"prompt_template": "Q: {prompt}"}}, {"context": "x", "choices": ["a", "b"], "gold": 0}],
     "prompt_template must be"),
    ([{"settings": {"kind": "generation"}}, {"context": "x", "choices": ["a", "b"], "gold": 0}],
     "settings say kind 'generation'"),
    ([{"id": "a", "context": "x", "choices": ["a", "b"], "gold": 0},
      {"id": "a", "context": "y", "choices": ["a", "b"], "gold": 0}], "id 'a' is also on line 1"),
    ([{"id": "a", "context": "x", "choices": ["a", "b"], "gold": 0},
      {"context": "y", "choices": ["a", "b"], "gold": 0}], "some lines have an 'id'"),
    (['{"context": "x"'], "not valid JSON"),
    ([{"prompt": "x", "references": "y", "split": "dev"}], "split must be"),
])
def test_errors_name_the_file_line_and_fix(tmp_path, rows, message):
    f = _write(tmp_path, rows)
    with pytest.raises(CustomFileError if "JSON" not in message else ValueError) as e:
        load_custom_file(f)
    assert str(f) in str(e.value) and message in str(e.value)
