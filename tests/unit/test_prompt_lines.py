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
