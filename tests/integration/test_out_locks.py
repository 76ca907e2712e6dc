"""One output, one run: `generate` and `agents` lock --out on its target (a symlink's too, so two
names of one file or folder are one output) and refuse a second run naming the first, before the
model loads."""

import json
import os

import pytest
from click.testing import CliRunner

from flexlamps.cli import main
from offload.lock import PathLock


def _assert_refused(res, given):
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert f"--out {given} is in use by process {os.getpid()}" in res.output, res.output


@pytest.mark.parametrize("through_link", [False, True])
def test_generate_refuses_an_out_another_run_holds(tiny_llama, tmp_path, no_model_load, through_link):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    target = tmp_path / "real" / "out.jsonl"
    target.parent.mkdir()
    given = target
    if through_link:
        given = tmp_path / "link.jsonl"
        given.symlink_to(target)
    with PathLock(target, "--out"):  # the other run, which named the target itself
        res = CliRunner().invoke(main, ["generate", "--model", str(tiny_llama), "--prompts", str(prompts),
                                        "--out", str(given)])
    _assert_refused(res, given)


@pytest.mark.parametrize("through_link", [False, True])
def test_agents_refuses_an_out_another_run_holds(tiny_llama, tmp_path, no_model_load, through_link):
    tasks = tmp_path / "gsm.jsonl"
    tasks.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "#### 5"}) + "\n")
    target = tmp_path / "runs" / "agents"
    target.mkdir(parents=True)
    given = target
    if through_link:
        given = tmp_path / "agents-link"
        given.symlink_to(target, target_is_directory=True)
    with PathLock(target, "--out"):
        res = CliRunner().invoke(main, ["agents", "--model", str(tiny_llama), "--gsm8k", str(tasks), "--out",
                                        str(given)])
    _assert_refused(res, given)
    assert list(target.iterdir()) == []
