"""`flexlamps eval` end to end on tiny YAML tasks over tiny JSON files written here (a multiple
choice, a rolling perplexity and a generation task, no network): lm_eval's own results JSON and
sample logs, the one-line refusal without lm_eval, and a killed run that resumes to the same
results."""

import json
import os
import re
import shlex
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from flexlamps import fault_points
from tests.conftest import REPO

MC = [{"query": "Question: Which animal barks?", "choices": ["a dog", "a fish", "the moon"], "gold": 0},
      {"query": "Question: What do you drink?", "choices": ["water", "stones"], "gold": 0},
      {"query": "Question: Numbers 0 1 2 3?", "choices": ["4 5 6", "the quick brown fox", "!?"], "gold": 0},
      {"query": "Question: Once upon a", "choices": ["time", "dog", "fox"], "gold": 0}]
TEXTS = [{"text": "the quick brown fox jumps over the lazy dog. " * 6}, {"text": "hello world, this is a tiny test"},
         {"text": "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation !?.,;:"}]
QA = [{"question": "the quick brown", "answer": "fox"}, {"question": "hello", "answer": "world"},
      {"question": "numbers 0 1 2", "answer": "3"}]

TASKS = {
    "tiny_mc": (MC, "output_type: multiple_choice\ndoc_to_text: \"{{query}}\\nAnswer:\"\ndoc_to_choice: \"{{choices}}\"\n"
                    "doc_to_target: gold\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"),
    "tiny_ppl": (TEXTS, "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
                        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
                        "  - metric: bits_per_byte\n"),
    "tiny_gen": (QA, "output_type: generate_until\ndoc_to_text: \"{{question}}\"\ndoc_to_target: \"{{answer}}\"\n"
                     "generation_kwargs:\n  until: [\"\\n\", \".\"]\n  max_gen_toks: 6\n  do_sample: false\n"
                     "metric_list:\n  - metric: exact_match\n"),
}


@pytest.fixture
def task_dir(tmp_path):
    """Three task YAMLs over JSONL files in tmp_path, read with datasets' json builder."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    for name, (rows, body) in TASKS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                             f"    test: {data}\ntest_split: test\n{body}")
    return folder


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _args(model, task_dir, out):
    return ["--model", str(model), "--dtype", "float32", "--tasks", ",".join(TASKS), "--include-path", str(task_dir),
            "--output-path", str(out), "--max-length", "32", "--log-samples", "--bootstrap-iters", "0",
            "--chunk-tokens", "24", "--no-progress", "--threads", "1"]


def _written(out):
    """(the results JSON, {task: its sample log lines}) of the run in `out`."""
    (results,) = out.glob("*/results_*.json")
    samples = {p.name.split("_20")[0]: [json.loads(x) for x in p.read_text().splitlines()]
               for p in out.glob("*/samples_*.jsonl")}
    return json.loads(results.read_text()), samples


def _cli(args, env=None):
    return subprocess.run([sys.executable, "-m", "flexlamps", "eval", *args], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


def _doc_command_lines(doc: str) -> list[str]:
    """The `flexlamps` lines of a doc's fenced shell blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```\n(.*?)```", (REPO / doc).read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix(".venv/bin/")
            if line.startswith("flexlamps "):
                lines.append(line)
    return lines


@pytest.mark.parametrize("line", _doc_command_lines("docs/eval.md"))
def test_docs_eval_lines_parse(line, monkeypatch):
    """Each of docs/eval.md's command lines names options and files `flexlamps eval` takes."""
    from flexlamps.cli import main

    monkeypatch.chdir(REPO)
    name, *args = shlex.split(line)[1:]
    main.get_command(click.Context(main), name).make_context(name, args)


def test_without_lm_eval_the_command_says_so_in_one_line(monkeypatch, tmp_path):
    import flexlamps.commands.eval as eval_cmd

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` raises ImportError
    res = CliRunner().invoke(eval_cmd.command, ["--tasks", "x", "--output-path", str(tmp_path)])
    assert res.exit_code == 1
    assert res.output == f"Error: {eval_cmd.NO_LM_EVAL}\n"


@pytest.mark.slow
@pytest.mark.ci
def test_an_unknown_task_is_named_before_the_model_loads(tmp_path, tiny_llama):
    """Slow: telling a name lm_eval lacks means indexing its whole registry (~40 s here)."""
    pytest.importorskip("lm_eval")
    import flexlamps.commands.eval as eval_cmd

    res = CliRunner().invoke(eval_cmd.command, ["--model", str(tiny_llama), "--tasks", "no_such_task_xyz",
                                                "--output-path", str(tmp_path)])
    assert res.exit_code == 2 and "no_such_task_xyz" in res.output and "--include-path" in res.output


def test_tasks_under_the_include_path_skip_lm_evals_registry(task_dir):
    pytest.importorskip("lm_eval")
    import flexlamps.commands.eval as eval_cmd

    names, manager = eval_cmd._tasks("tiny_gen,tiny_mc,tiny_gen", str(task_dir))
    assert names == ["tiny_gen", "tiny_mc"] and manager.all_tasks == sorted(TASKS)
    # a group's members may be lm_eval's own tasks: resolved over the whole registry instead
    (task_dir / "tiny_group.yaml").write_text("group: tiny_group\ntask:\n  - tiny_mc\n  - arc_easy\n")
    assert eval_cmd._local_tasks("tiny_group", str(task_dir)) is None
    assert eval_cmd._local_tasks("tiny_mc,arc_easy", str(task_dir)) is None


def test_an_include_path_without_task_yamls_is_refused_before_the_registry_is_indexed(task_dir, monkeypatch):
    """A folder or file with no *.yaml: one line naming --include-path, not lm_eval's ~40 s index of
    its own registry (where the names would be looked up) followed by an unknown-task error."""
    pytest.importorskip("lm_eval")
    from lm_eval.config.evaluate_config import EvaluatorConfig

    import flexlamps.commands.eval as eval_cmd

    monkeypatch.setattr(EvaluatorConfig, "process_tasks", lambda *a: pytest.fail("indexed lm_eval's registry"))
    (task_dir / "notes.txt").write_text("no tasks here")
    for path in (task_dir / "notes.txt", task_dir / "empty"):
        (task_dir / "empty").mkdir(exist_ok=True)
        with pytest.raises(click.BadParameter, match="holds no task YAML"):
            eval_cmd._tasks("tiny_mc", str(path))


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.faults
def test_a_killed_eval_resumes_to_the_same_results(tmp_path, tiny_llama, task_dir):
    pytest.importorskip("lm_eval")
    whole = _cli(_args(tiny_llama, task_dir, tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    results, samples = _written(tmp_path / "whole")
    assert set(results["results"]) == set(TASKS) and set(samples) == {f"samples_{t}" for t in TASKS}
    assert results["results"]["tiny_ppl"]["word_perplexity,none"] > 1
    assert results["config"]["model"] == "flexlamps" and results["n-samples"]["tiny_mc"]["effective"] == len(MC)

    out = tmp_path / "killed"
    killed = _cli(_args(tiny_llama, task_dir, out), env=fault_points.kill_at("eval_part", 3))
    assert killed.returncode == -9 and not list(out.glob("*/results_*.json"))
    resumed = _cli(_args(tiny_llama, task_dir, out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again, again_samples = _written(out)
    for key in ("results", "configs", "n-samples", "versions"):
        assert again[key] == results[key]
    assert again_samples == samples
