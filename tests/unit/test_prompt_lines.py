"""Reading plain JSONL prompt lines (torch-free): `prompt` or `messages`, an optional
`json_schema` and `n` samples; a line that cannot run refuses the file naming the line and the fix."""

import json

import pytest

from flexlamps.io.prompts import PromptFileError, read_prompts


def _file(tmp_path, *lines):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return path


def test_n_is_read_and_not_copied_to_the_output(tmp_path):
    three, one = read_prompts(_file(tmp_path, {"id": "a", "prompt": "x", "n": 3, "tag": 1},
                                    {"id": "b", "messages": [{"role": "user", "content": "y"}]}))
    assert (three.n, three.extra) == (3, {"tag": 1}) and (one.n, one.extra) == (1, {})
    assert three.identity() != read_prompts(_file(tmp_path, {"id": "a", "prompt": "x", "tag": 1}))[0].identity()


@pytest.mark.parametrize("n", [0, 129, 2.0, "3", True, None])
def test_a_bad_n_refuses_the_file_naming_the_line(tmp_path, n):
    path = _file(tmp_path, {"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y", "n": n})
    with pytest.raises(PromptFileError, match=r"prompts\.jsonl:2: \"n\" \(samples of the prompt\) must be an "
                                              r"integer from 1 to 128, got " + json.dumps(n)):
        read_prompts(path)


@pytest.mark.parametrize("bad, problem", [('{"id": 2, "prompt": "y"', r"not valid JSON \(.* at column 24\)"),
                                          ('[1, 2]', "expected a JSON object, got list")])
def test_prompt_and_evaluation_files_walk_their_lines_alike(tmp_path, bad, problem):
    """One line reader (flexlamps.io.jsonl): blank lines skipped, the fault named by its line, each
    reader raising its own error with its own fix."""
    from flexlamps.evals.scenario_files import ScenarioError, read_jsonl

    path = tmp_path / "lines.jsonl"
    path.write_text('{"id": 1, "prompt": "x"}\n\n' + bad + "\n")
    with pytest.raises(PromptFileError, match=rf"lines\.jsonl:3: {problem}; each line must be one JSON object"):
        read_prompts(path)
    with pytest.raises(ScenarioError, match=rf"lines\.jsonl:3: {problem}; fix or remove that line"):
        read_jsonl(path)
    path.write_text('{"id": 1, "prompt": "x"}\n\n{"id": 2, "prompt": "y"}\n')
    assert [n for n, _ in read_jsonl(path)] == [1, 3]
