"""Every command, every option, malformed values: each ends in a one-line error (exit 1, or 2 for
a usage error) before any model loads, with no traceback.

The cases come from the commands themselves (click's parameters): each option gets the bad
values its type and role allow (missing, empty, non-directory, unwritable paths; bad sizes,
numbers and enum names), beside valid values of the required options. The work a command does
after its checks (loading a model, profiling, simulating, solving) is replaced by a sentinel,
so a value that slips through the checks fails here as "reached the work", in milliseconds.
"""

from __future__ import annotations

import json
import os

import click
import pytest
from click.testing import CliRunner

from flexlamps.cli import main

# options a command writes to (their parents are made; bad ones are under a file or unwritable)
OUTPUTS = {"--out", "--output-path", "--offload-dir"}
# options not fuzzed: what a cluster address means is Ray's to say
SKIPPED = {"--ray", "--help", "--version"}
# named string options and the bad values of each
NAMED = {
    "--model": ["no-such-model", "{empty_dir}", "{empty_gguf}", "{bad_config_dir}"],
    "--policy": ["{missing}", "{empty}", "{a_dir}"],
    "--placement": ["{missing}", "{empty}", "{a_dir}"],
    "--hardware": ["no-such-machine", "{empty}"],
    "--scenario": ["no-such-scenario", "mmlu", "file", "arc:subset=medium"],
    "--llm-arg": ["no-equals", "no_such_key=1", "max_batch_size=many", "reuse_prefix=maybe", "model=x"],
    "--qps": ["fast", "-1", ","],
    "--policies": ["no-such-policy", ","],
    "--schedulers": ["no-such-policy", ","],
    "--gpu-mem": ["lots", "-1GiB", "12XB"],
    "--cpu-mem": ["lots", "-1GiB"],
    "--gpu-kv-mem": ["lots"],
    "--cpu-swap-mem": ["lots"],
}
# number options a negative value is fine for (every other number counts, sizes or scales something)
SIGNED = {"--seed"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "afile").write_text("x\n")
    (d / "empty").write_text("")
    (d / "empty.gguf").write_text("")
    (d / "a_dir").mkdir()
    (d / "empty_dir").mkdir()
    (d / "bad_config").mkdir()
    (d / "bad_config" / "config.json").write_text("{")
    (d / "prompts.txt").write_text("hello\n")
    (d / "trace.json").write_text(json.dumps({"r1": [
        {"prompt_tokens": 30, "completion_tokens": 8, "api_time": 0.1, "api_token_length": 4},
        {"prompt_tokens": 40, "completion_tokens": 6}]}))
    return d


def _baseline(name: str, d) -> list[str]:
    """Valid values of a command's required options."""
    out = str(d / "out")
    return {
        "generate": ["--prompts", str(d / "prompts.txt"), "--out", out + ".jsonl"],
        "plan": ["--model", "llama-2-7b"],
        "profile": ["--out", out + ".json", "--quick"],
        "helm": ["--scenario", "demo", "--output-path", out],
        "eval": ["--tasks", "no_such_task", "--output-path", out],
        "agents": ["--trace", str(d / "trace.json"), "--out", out],
        "simulate": ["--trace", str(d / "trace.json"), "--out", out],
    }.get(name, [])


def _path_values(param: click.Option, d) -> list[str]:
    t = param.type
    if param.opts[0] in OUTPUTS:
        bad = [str(d / "afile" / "x"), "/proc/flexlamps-fuzz/x"]
        return bad + ([str(d / "a_dir")] if not t.dir_okay else [str(d / "afile")] if not t.file_okay else [])
    bad = [str(d / "missing" / "x")]
    bad += [str(d / "a_dir")] if not t.dir_okay else [str(d / "afile")] if not t.file_okay else []
    if t.file_okay:
        bad.append(str(d / "empty"))
    return bad


def _values(param: click.Option, d) -> list[str]:
    """The malformed values of one option."""
    name, t = param.opts[0], param.type
    if name in NAMED:
        return [v.format(missing=d / "missing.json", empty=d / "empty", a_dir=d / "a_dir", empty_dir=d / "empty_dir",
                         empty_gguf=d / "empty.gguf", bad_config_dir=d / "bad_config") for v in NAMED[name]]
    if isinstance(t, click.Path):
        return _path_values(param, d)
    if isinstance(t, click.Choice):
        return ["no-such-choice"]
    if t.name == "size":
        return ["lots", "-3MiB"]
    if isinstance(t, (click.types.IntParamType, click.types.FloatParamType)):
        return ["not-a-number"] + (["-5"] if name not in SIGNED else [])
    return []


def _cases():
    """(command, option, value) for every fuzzable option of every command."""
    out = []
    for name in main.list_commands(None):
        cmd = main.get_command(None, name)
        for param in cmd.params:
            if not isinstance(param, click.Option) or param.is_flag or param.opts[0] in SKIPPED:
                continue
            out.append((name, param.opts[0]))
    return out


class ReachedTheWork(Exception):
    pass


@pytest.fixture
def no_work(monkeypatch):
    """Replace what a command does after its checks by a sentinel."""
    import flexlamps.api
    import flexlamps.commands.plan
    import flexlamps.commands.profile
    import flexlamps.sim.sweep

    def refuse(*args, **kwargs):
        raise ReachedTheWork()

    for owner, attr in ((flexlamps.api.LLM, "__init__"), (flexlamps.api.LLM, "from_settings"),
                        (flexlamps.commands.profile, "profile_machine"), (flexlamps.sim.sweep, "measure"),
                        (flexlamps.sim.sweep, "saturation"), (flexlamps.commands.plan, "solve"),
                        (flexlamps.commands.plan, "evaluate")):
        monkeypatch.setattr(owner, attr, refuse)


def _one_line_error(result) -> str | None:
    """Why `result` is not a clean refusal, or None when it is."""
    if isinstance(result.exception, ReachedTheWork):
        return "the bad value got past every check (the command reached its work)"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"traceback: {type(result.exception).__name__}: {result.exception}"
    if result.exit_code not in (1, 2):
        return f"exit status {result.exit_code}"
    if "Traceback" in result.output:
        return "a traceback in the output"
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    if len(errors) != 1:
        return f"expected one 'Error:' line, got {len(errors)}"
    return None


CASES = _cases()


@pytest.mark.parametrize("command,option", CASES, ids=[f"{c}{o}" for c, o in CASES])
def test_every_malformed_value_is_one_line_error_before_any_model_loads(command, option, files, no_work,
                                                                        monkeypatch):
    monkeypatch.chdir(files)
    param = next(p for p in main.get_command(None, command).params if p.opts[0] == option)
    values = _values(param, files)
    if not values:
        pytest.skip(f"{command} {option}: any string is a valid value")
    failures = []
    for value in values:
        args = [command, *_baseline(command, files), option, value]
        if option == "--offload-dir" and command == "agents":
            args += ["--gpu-mem", "64MiB", "--cpu-mem", "64MiB"]
        result = CliRunner().invoke(main, args)
        why = _one_line_error(result)
        if why is not None:
            failures.append(f"{' '.join(args[1:])!r}: {why}\n{result.output[-600:]}")
    assert not failures, "\n".join(failures)


def test_the_walk_covers_every_command():
    flags_only = {"env", "models"}  # nothing to malform
    assert {c for c, _ in CASES} == set(main.list_commands(None)) - flags_only
    assert len(CASES) >= 90


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes files whatever their permissions")
def test_unreadable_prompt_file_is_one_line_error(files, no_work, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\n")
    prompts.chmod(0)
    result = CliRunner().invoke(main, ["generate", "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")])
    assert _one_line_error(result) is None, result.output
