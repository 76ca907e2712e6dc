"""`flexlamps helm` end to end on the deterministic fake LM: HELM's file set and shapes, values,
resume after a failure, skip when done, and crfm-helm's own `helm-summarize` on the suite."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import flexlamps.commands.helm as helm_cmd
from flexlamps.evals.helm_output import RUN_FILES
from tests.fake_lm import FakeLLM, SamplingParams
from tests.conftest import SHARED_DATA

# The demo's test questions the fake answers right: 2 of 8 -> quasi_exact_match 0.25, exact_match 1/8
ANSWERS = {"capital of Italy": " Rome\n", "legs does a spider": " eight\n"}


@pytest.fixture
def use_fake(monkeypatch):
    made = []

    def factory(**kw):
        def load(model, dtype, llm_args):
            made.append(FakeLLM(**kw))
            return made[-1]
        monkeypatch.setattr(helm_cmd, "load_llm", load)
        monkeypatch.setattr(helm_cmd, "sampling_params_factory", lambda: SamplingParams)
        return made
    return factory


@pytest.fixture
def mc_file(tmp_path):
    f = tmp_path / "colors.jsonl"
    rows = [{"question": f"Color number {i}?", "choices": ["red", "green", "blue"], "gold": i % 3} for i in range(5)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def _run(tmp_path, *args):
    res = CliRunner().invoke(helm_cmd.command, ["--suite", "s1", "--output-path", str(tmp_path / "out"), *args],
                             catch_exceptions=False)
    return res


def _load(run_dir, name):
    return json.loads((run_dir / name).read_text())


def test_end_to_end_files_and_shapes(tmp_path, use_fake, mc_file):
    use_fake(answers=ANSWERS)
    res = _run(tmp_path, "--scenario", "demo", "--scenario-file", str(mc_file), "--batch-size", "3")
    assert res.exit_code == 0, res.output
    suite = tmp_path / "out" / "runs" / "s1"
    demo = suite / "demo:model=flexlamps_smollm2-135m"
    mc = suite / "file:name=colors,model=flexlamps_smollm2-135m"
    for run in (demo, mc):
        assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == sorted(RUN_FILES)
        assert not list(run.glob("*.tmp"))
    state = _load(demo, "scenario_state.json")
    assert state["adapter_spec"]["method"] == "generation"
    for rs in state["request_states"]:
        assert rs["instance"]["id"] and all("tags" in r for r in rs["instance"]["references"])
        assert rs["result"]["embedding"] == [] and rs["result"]["completions"][0]["tokens"]
    assert len(state["request_states"]) == 8
    stats = {s["name"]["name"]: s for s in _load(demo, "stats.json")}
    assert stats["quasi_exact_match"]["count"] == 1 and stats["quasi_exact_match"]["sum"] == pytest.approx(0.25)
    assert stats["exact_match"]["sum"] == pytest.approx(1 / 8)  # " Rome" == "Rome" after strip; "eight" != "Eight"
    assert stats["num_instances"]["sum"] == 8 and stats["num_train_instances"]["sum"] == 2
    spec = _load(demo, "run_spec.json")
    assert spec["metric_specs"] and spec["groups"] == ["demo"]
    assert _load(demo, "scenario.json")["tags"]
    per = _load(mc, "per_instance_stats.json")
    assert len(per) == 5 and all(s["count"] == 1 for p in per for s in p["stats"])
    preds = _load(mc, "display_predictions.json")
    assert len(preds) == 5 and all(p["reference_index"] == p["stats"]["predicted_index"] for p in preds)
    summary = json.loads((suite / "flexlamps_summary.json").read_text())
    assert {r["run"] for r in summary["runs"]} == {demo.name, mc.name}
    assert demo.name in res.output and "prefill reuse" in res.output


def test_exact_match_needs_the_words_not_the_case(tmp_path, use_fake):
    use_fake(answers={"capital of Italy": " rome\n"})
    _run(tmp_path, "--scenario", "demo")
    demo = tmp_path / "out" / "runs" / "s1" / "demo:model=flexlamps_smollm2-135m"
    stats = {s["name"]["name"]: s["sum"] for s in _load(demo, "stats.json")}
    assert stats["exact_match"] == 0 and stats["quasi_exact_match"] == pytest.approx(1 / 8)


def test_multiple_choice_scores_follow_the_fake_model(tmp_path, use_fake, mc_file):
    made = use_fake()
    _run(tmp_path, "--scenario-file", str(mc_file))
    run = tmp_path / "out" / "runs" / "s1" / "file:name=colors,model=flexlamps_smollm2-135m"
    llm = made[0]
    correct = 0
    for i in range(5):
        ctx = f"Color number {i}?"  # the default format: no template
        scores = [o.logprob / len(c) for o, c in
                  zip(llm.score([ctx] * 3, [" red", " green", " blue"]), [" red", " green", " blue"])]
        correct += scores.index(max(scores)) == i % 3
    stats = {s["name"]["name"]: s["sum"] for s in _load(run, "stats.json")}
    assert stats["mc_accuracy_char_norm"] == pytest.approx(correct / 5)
    # the three choices of a question share their context: most prefill is reused
    assert stats["prefill_tokens_computed"] < stats["prefill_tokens_requested"] / 2


def test_resume_after_failure_and_skip_when_done(tmp_path, use_fake, mc_file):
    use_fake(fail_after_calls=2)
    with pytest.raises(RuntimeError, match="fake engine failure"):
        _run(tmp_path, "--scenario-file", str(mc_file), "--batch-size", "4")
    run = tmp_path / "out" / "runs" / "s1" / "file:name=colors,model=flexlamps_smollm2-135m"
    assert not (run / "stats.json").exists()
    done = (run / ".flexlamps_progress.jsonl").read_text().splitlines()
    assert len(done) == 8  # two batches of 4 of the 15 requests
    made = use_fake()
    res = _run(tmp_path, "--scenario-file", str(mc_file), "--batch-size", "4")
    assert res.exit_code == 0
    assert made[-1].calls == 2  # only the 7 requests left, in two batches
    resumed = _load(run, "stats.json")
    clean_dir = tmp_path / "clean"
    use_fake()
    CliRunner().invoke(helm_cmd.command, ["--suite", "s1", "--output-path", str(clean_dir),
                                          "--scenario-file", str(mc_file)], catch_exceptions=False)
    clean = _load(clean_dir / "runs" / "s1" / run.name, "stats.json")
    pick = lambda st: {s["name"]["name"]: s["sum"] for s in st if s["name"]["name"].startswith("mc_")}  # noqa: E731
    assert pick(resumed) == pick(clean)
    totals = ("num_requests", "total_prompt_tokens", "prefill_tokens_requested")
    whole = lambda st: {s["name"]["name"]: s["sum"] for s in st if s["name"]["name"] in totals}  # noqa: E731
    assert whole(resumed) == whole(clean) and whole(clean)["num_requests"] == 15  # over the whole run
    computed = lambda st: next(s["sum"] for s in st if s["name"]["name"] == "prefill_tokens_computed")  # noqa: E731
    assert computed(resumed) >= computed(clean)  # the second invocation recomputed the shared prefix
    made = use_fake()
    loaded = len(made)
    res = _run(tmp_path, "--scenario-file", str(mc_file), "--batch-size", "4")
    assert res.exit_code == 0 and len(made) == loaded  # finished run: the model is not even loaded
    assert "skipped (done)" in res.output


def test_editing_the_file_reruns_it_and_ids_are_kept(tmp_path, use_fake):
    f = tmp_path / "ids.jsonl"
    rows = [{"id": f"q-{c}", "context": f"Color {c}?", "choices": ["red", "green"], "gold": 0} for c in "ab"]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    use_fake()
    _run(tmp_path, "--scenario-file", str(f))
    run = tmp_path / "out" / "runs" / "s1" / "file:name=ids,model=flexlamps_smollm2-135m"
    assert [p["instance_id"] for p in _load(run, "per_instance_stats.json")] == ["q-a", "q-b"]
    assert {p["instance_id"] for p in _load(run, "display_predictions.json")} == {"q-a", "q-b"}
    assert {s["instance"]["id"] for s in _load(run, "scenario_state.json")["request_states"]} == {"q-a", "q-b"}
    res = _run(tmp_path, "--scenario-file", str(f))
    assert "skipped (done)" in res.output
    rows[1]["choices"] = ["red", "a much longer green"]  # same name, same line count, other content
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _run(tmp_path, "--scenario-file", str(f))
    assert "skipped (done)" not in res.output
    states = _load(run, "scenario_state.json")["request_states"]
    assert "a much longer green" in {s["request"]["prompt"][len("Color b?"):].strip() for s in states}


def test_other_weights_are_not_served_from_the_log(tmp_path, use_fake, mc_file):
    from flexlamps.evals.executor import ProgressLog

    made = use_fake()
    _run(tmp_path, "--scenario-file", str(mc_file))
    run = tmp_path / "out" / "runs" / "s1" / "file:name=colors,model=flexlamps_smollm2-135m"
    (run / "stats.json").unlink()  # as if interrupted before the end
    made = use_fake()
    _run(tmp_path, "--scenario-file", str(mc_file), "--dtype", "bfloat16")
    assert made[-1].calls > 0  # another dtype: nothing reused
    lines = (run / ".flexlamps_progress.jsonl").read_text().splitlines()
    assert len({json.loads(ln)["key"] for ln in lines}) == 30  # 15 requests under each engine identity
    assert ProgressLog  # the log keys results by request and engine


def test_generation_file_with_aliases_stays_generation(tmp_path, use_fake):
    use_fake(answers={"Peru": " Lima\n"})
    f = tmp_path / "caps.jsonl"
    f.write_text('{"input": "Capital of Peru?", "answer": ["Lima", "Lima city"]}\n'
                 '{"input": "Capital of Chile?", "answer": "Santiago"}\n')
    _run(tmp_path, "--scenario-file", str(f))
    run = tmp_path / "out" / "runs" / "s1" / "file:name=caps,model=flexlamps_smollm2-135m"
    stats = {s["name"]["name"]: s["sum"] for s in _load(run, "stats.json")}
    assert _load(run, "run_spec.json")["adapter_spec"]["method"] == "generation"
    assert stats["exact_match"] == pytest.approx(0.5)


def test_bad_scenario_is_a_usage_error(tmp_path, use_fake):
    use_fake()
    res = CliRunner().invoke(helm_cmd.command, ["--scenario", "nope", "--output-path", str(tmp_path)])
    assert res.exit_code == 2 and "unknown scenario 'nope'" in res.output


def _helm_summarize():
    exe = Path(sys.executable).with_name("helm-summarize")
    return exe if exe.exists() else shutil.which("helm-summarize")


@pytest.mark.skipif(_helm_summarize() is None, reason="crfm-helm is not installed (see docs/helm.md)")
def test_helm_summarize_reads_the_suite(tmp_path, use_fake, mc_file):
    use_fake(answers=ANSWERS)
    _run(tmp_path, "--scenario", "demo", "--scenario-file", str(mc_file))
    out = tmp_path / "out"
    cmd = [str(_helm_summarize()), "--suite", "s1", "--output-path", str(out),
           "--schema-path", str(out / "schema_flexlamps.json"), "--local-path", str(out / "prod_env"),
           "--num-threads", "1"]  # as the command prints it (CPython 3.11's AST race on several threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    # it exits 0 even when it drops a run: check that both runs made it into its outputs
    assert "skipping" not in log and "Traceback" not in log
    runs = json.loads((out / "runs" / "s1" / "runs.json").read_text())
    assert len(runs) == 2
    table = json.loads((out / "runs" / "s1" / "groups" / "demo.json").read_text())[0]
    row = table["rows"][0]
    assert row[0]["value"] == "SmolLM2 135M Instruct (flexlamps)"  # display name from our metadata
    assert row[1]["value"] == pytest.approx(0.25)  # the group's main metric: quasi_exact_match
    # the user's file has a table of its own, headed by its metric (char-normalized accuracy)
    custom = json.loads((out / "runs" / "s1" / "groups" / "custom_colors.json").read_text())[0]
    mc = tmp_path / "out" / "runs" / "s1" / "file:name=colors,model=flexlamps_smollm2-135m"
    acc = {s["name"]["name"]: s["sum"] for s in _load(mc, "stats.json")}["mc_accuracy_char_norm"]
    assert custom["header"][1]["value"].startswith("acc_norm")  # the metric's short name heads the column
    assert custom["rows"][0][1]["value"] == pytest.approx(acc)


def test_atomic_write_leaves_nothing_half_written(tmp_path):
    from flexlamps.evals.helm_output import write_json_atomic

    p = tmp_path / "x.json"
    write_json_atomic(p, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(p, {"a": object()})
    assert json.loads(p.read_text()) == {"a": 1} and list(tmp_path.iterdir()) == [p]


DATA = SHARED_DATA


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present beside the checkout")
def test_five_shot_prefix_is_shared_and_reported(tmp_path, use_fake):
    use_fake()
    _run(tmp_path, "--scenario", "mmlu:subject=anatomy,method=cloze", "--num-shots", "5",
         "--max-eval-instances", "10", "--data-dir", str(DATA))
    run = tmp_path / "out" / "runs" / "s1" / "mmlu:subject=anatomy,method=cloze,num_shots=5,model=flexlamps_smollm2-135m"
    states = _load(run, "scenario_state.json")["request_states"]
    assert len(states) == 40 and all(s["num_train_instances"] == 5 for s in states)
    prefix = states[0]["request"]["prompt"].rsplit("Question: ", 1)[0]
    assert prefix.count("Question: ") == 5 and all(s["request"]["prompt"].startswith(prefix) for s in states)
    stats = {s["name"]["name"]: s["sum"] for s in _load(run, "stats.json")}
    # the fake engine reuses any prefix seen before, so only the first prompt pays for the examples
    assert stats["prefill_reuse_factor"] > 5
    assert stats["prefill_tokens_requested"] == sum(s["result"]["num_prompt_tokens"] for s in states)


def test_helm_codec_reads_every_file(tmp_path, use_fake, mc_file):
    pytest.importorskip("helm.common.codec", reason="crfm-helm is not installed (see docs/helm.md)")
    from typing import List

    from helm.benchmark.adaptation.scenario_state import ScenarioState
    from helm.benchmark.metrics.metric import PerInstanceStats
    from helm.benchmark.metrics.statistic import Stat as HelmStat
    from helm.benchmark.presentation.run_display import DisplayPrediction, DisplayRequest
    from helm.benchmark.run_spec import RunSpec
    from helm.benchmark.scenarios.scenario import Instance
    from helm.common.codec import from_json

    use_fake(answers=ANSWERS)
    _run(tmp_path, "--scenario", "demo", "--scenario-file", str(mc_file))
    runs = sorted((tmp_path / "out" / "runs" / "s1").glob("*:*"))
    assert len(runs) == 2
    for run in runs:
        state = from_json((run / "scenario_state.json").read_text(), ScenarioState)
        assert all(rs.result.completions[0].tokens for rs in state.request_states)
        assert from_json((run / "per_instance_stats.json").read_text(), List[PerInstanceStats])
        stats = from_json((run / "stats.json").read_text(), List[HelmStat])
        assert all(s.count == 1 and s.sum == s.mean for s in stats)
        assert from_json((run / "run_spec.json").read_text(), RunSpec).metric_specs
        assert from_json((run / "display_predictions.json").read_text(), List[DisplayPrediction])
        assert from_json((run / "display_requests.json").read_text(), List[DisplayRequest])
        assert from_json((run / "instances.json").read_text(), List[Instance])


def test_evals_do_not_import_torch():
    code = ("import sys, flexlamps.commands.helm, flexlamps.evals.runner, flexlamps.evals.summary; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_llm_args_are_typed_as_llms_own_options(tmp_path, monkeypatch):
    """--llm-arg values reach LLM(...) as its options' types: the option's own example runs, and
    false is False (a string would be truthy)."""
    seen = []

    def load(model, dtype, llm_args):
        seen.append(llm_args)
        return FakeLLM(answers=ANSWERS)
    monkeypatch.setattr(helm_cmd, "load_llm", load)
    monkeypatch.setattr(helm_cmd, "sampling_params_factory", lambda: SamplingParams)
    res = _run(tmp_path, "--scenario", "demo", "--llm-arg", "max_batch_size=8", "--llm-arg", "reuse_prefix=false",
               "--llm-arg", "cpu_mem=64MiB", "--llm-arg", "device=none")
    assert res.exit_code == 0, res.output
    assert {k: seen[0][k] for k in ("max_batch_size", "reuse_prefix", "cpu_mem", "device")} == {
        "max_batch_size": 8, "reuse_prefix": False, "cpu_mem": 64 << 20, "device": None}


@pytest.mark.parametrize("arg,needle", [("batch=8", "unknown key 'batch'; LLM's options: max_batch_size"),
                                        ("max_batch_size=eight", "max_batch_size='eight': 'eight' is not a valid"),
                                        ("max_batch_size=0", "max_batch_size must be >= 1"),
                                        ("dtype=float32", "dtype: give it as --dtype")])
def test_bad_llm_args_are_named_before_anything_loads(tmp_path, monkeypatch, arg, needle):
    monkeypatch.setattr(helm_cmd, "load_llm", lambda *a: pytest.fail("the model loaded"))
    res = CliRunner().invoke(helm_cmd.command, ["--scenario", "demo", "--output-path", str(tmp_path), "--llm-arg",
                                                arg])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output
