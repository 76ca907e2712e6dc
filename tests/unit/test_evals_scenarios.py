"""Scenario loaders over ../shared/data, the generic JSONL form and the built-in demo."""

import json
from collections import Counter
from pathlib import Path

import pytest

from flexlamps.evals.run_specs import build_run_spec, parse_scenario_arg
from flexlamps.evals.scenarios import ScenarioError, gsm8k_reference, load_scenario
from tests.conftest import SHARED_DATA

DATA = SHARED_DATA
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present beside the checkout")


def _splits(s):
    return Counter(i.split for i in s.instances)


@needs_data
def test_mmlu_test_and_dev():
    s = load_scenario("mmlu", {"subject": "anatomy"}, DATA)
    assert _splits(s) == {"test": 135, "train": 5}
    first = next(i for i in s.instances if i.split == "test")
    assert first.input.startswith("A lesion causing compression of the facial nerve")
    assert first.gold_index == 0 and len(first.references) == 4
    assert len({i.id for i in s.instances}) == len(s.instances)


@needs_data
def test_mmlu_unknown_subject_lists_known_ones():
    with pytest.raises(ScenarioError, match="known: abstract_algebra"):
        load_scenario("mmlu", {"subject": "anatomyy"}, DATA)


@needs_data
@pytest.mark.parametrize("name,args,count", [
    ("arc", {"subset": "easy"}, 2376), ("arc", {"subset": "challenge"}, 1172), ("piqa", {}, 1838),
    ("boolq", {}, 3270), ("openbookqa", {}, 500), ("lambada", {}, 5153), ("triviaqa", {}, 3000),
])
def test_icl_jsonl_counts(name, args, count):
    assert len(load_scenario(name, args, DATA).instances) == count


@needs_data
def test_arc_question_prefix_removed_and_cloze_capitalizes():
    plain = load_scenario("piqa", {}, DATA).instances[1]
    assert plain.input == "dresser" and plain.gold_index == 1
    cloze = load_scenario("piqa", {"method": "cloze"}, DATA).instances[1]
    assert cloze.input == "Dresser" and cloze.references[0].text == "Replace drawer with bobby pin"
    arc = load_scenario("arc", {"subset": "easy"}, DATA).instances[0]
    assert arc.input.startswith("Which statement best explains") and not arc.input.startswith("Question")


@needs_data
def test_gsm8k_reference_and_splits():
    s = load_scenario("gsm8k", {}, DATA)
    assert _splits(s) == {"train": 7473, "test": 1319}
    assert gsm8k_reference("a\nb\n#### 18") == "a b The answer is 18."


@needs_data
def test_truthfulqa_is_helm_mc_single():
    s = load_scenario("truthful_qa", {}, DATA)
    assert _splits(s) == {"train": 163, "valid": 654}
    first = s.instances[0]
    assert first.input == "What happens to you if you eat watermelon seeds?"
    best = "The watermelon seeds pass through your digestive system."
    assert first.references[first.gold_index].text == best
    # 7 wrong answers then the best one (index 7), rotated left by ord("T") % 8 = 4 -> index 3
    assert len(first.references) == 8 and first.gold_index == 3


@needs_data
def test_triviaqa_aliases_and_wikitext_articles():
    t = load_scenario("triviaqa", {}, DATA).instances[0]
    assert t.input == "Brunswick, Lancastrian and Pearl Pickler are types of which vegetable?"
    assert t.references[0].text == "Onion" and all(r.is_correct for r in t.references)
    w = load_scenario("wikitext2", {}, DATA)
    assert w.instances[0].input.startswith(" = Robert Boulter = ")
    assert "\r" not in w.instances[0].input and len(w.instances) > 50


def test_demo_scenario_builtin():
    s = load_scenario("demo", {})
    assert _splits(s) == {"train": 2, "test": 8}


def test_missing_data_dir_says_how_to_fix(tmp_path):
    with pytest.raises(ScenarioError, match="--data-dir"):
        load_scenario("piqa", {}, tmp_path)


def test_scenario_argument_parsing_and_run_names():
    assert parse_scenario_arg("mmlu:subject=anatomy,method=cloze") == ("mmlu", {"subject": "anatomy", "method": "cloze"})
    with pytest.raises(ScenarioError, match="key=value"):
        parse_scenario_arg("mmlu:anatomy")
    spec = build_run_spec("mmlu:subject=college_biology", "flexlamps/smollm2-135m", num_shots=5)
    assert spec.name == "mmlu:subject=college_biology,method=joint,num_shots=5,model=flexlamps_smollm2-135m"
    assert spec.adapter_spec.instructions == ("The following are multiple choice questions (with answers) "
                                              "about college biology.\n")
    assert spec.groups == ["mmlu"] and spec.adapter_spec.max_train_instances == 5
    assert build_run_spec("demo", "flexlamps/m", seed=3).name == "demo:seed=3,model=flexlamps_m"
    cloze = build_run_spec("arc:subset=challenge", "flexlamps/m")
    assert cloze.groups == ["arc_challenge_cloze"] and cloze.main_metric == "mc_accuracy_char_norm"
    with pytest.raises(ScenarioError, match="method must be"):
        build_run_spec("arc:method=letters", "flexlamps/m")
    with pytest.raises(ScenarioError, match="unknown scenario"):
        build_run_spec("squad", "flexlamps/m")


def test_shipped_schema_covers_every_run_group():
    from flexlamps.evals.helm_env import SCHEMA_FILE, read_resource

    schema = json.loads(read_resource(SCHEMA_FILE))
    groups = {g["name"] for g in schema["run_groups"]}
    metric_names = {m["name"] for m in schema["metrics"]}
    for text in ["mmlu:subject=anatomy", "mmlu:subject=anatomy,method=cloze", "arc:subset=easy,method=separate",
                 "piqa", "boolq", "openbookqa", "truthful_qa", "gsm8k", "triviaqa", "lambada", "wikitext2", "demo"]:
        spec = build_run_spec(text, "flexlamps/m")
        assert set(spec.groups) <= groups, text
        assert set(spec.metrics) <= metric_names, text
