"""Chat templates render as transformers renders them: `tools` and `documents` are variables a
template may test, undefined names are falsy, `tojson` writes plain JSON, and a template runs in a
sandbox (it comes with the user's checkpoint)."""

import json

import pytest

from flexlamps.models.loading.tokenizer import tokenizer_from_hf_folder
from tests.conftest import save_tiny_tokenizer

# A Hermes-style template written for this test: a system turn listing the tools when given,
# <tool_call> turns, tool results as <tool_response> in a user turn, and a variable nobody sets.
HERMES = (
    "{%- if tools %}<|im_start|>system\nTools:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if enable_thinking is defined and enable_thinking %}<think>{%- endif %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add <a> & <b>: it's 'safe'",
                                             "parameters": {"type": "object", "properties": {
                                                 "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CONVERSATION = [{"role": "user", "content": "What is 2 + 3?"},
                {"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'},
                {"role": "tool", "content": "5"}]


def _folder(tmp_path, template):
    tmp_path.mkdir(parents=True, exist_ok=True)
    save_tiny_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("generation", [True, False])
def test_render_equals_transformers(tmp_path, tools, generation):
    transformers = pytest.importorskip("transformers")
    folder = _folder(tmp_path, HERMES)
    ours = tokenizer_from_hf_folder(folder).apply_chat_template(CONVERSATION, generation, tools=tools)
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(folder).apply_chat_template(
        CONVERSATION, tools=tools, tokenize=False, add_generation_prompt=generation)
    assert ours == theirs
    assert ('"description": "Add <a> & <b>: it\'s \'safe\'"' in ours) == (tools is not None)


def test_template_takes_tools_is_read_off_the_template(tmp_path):
    assert tokenizer_from_hf_folder(_folder(tmp_path / "h", HERMES)).template_takes_tools
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert not tokenizer_from_hf_folder(_folder(tmp_path / "p", plain)).template_takes_tools


def test_a_template_cannot_reach_python(tmp_path):
    from jinja2.exceptions import SecurityError

    sneaky = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(SecurityError):
        tokenizer_from_hf_folder(_folder(tmp_path, sneaky)).apply_chat_template(CONVERSATION)


@pytest.mark.parametrize("template,shown_by_template", [(HERMES, True), ("{% for m in messages %}{{ m['role'] }}: "
                                                                         "{{ m['content'] }}\n{% endfor %}", False)])
def test_a_tool_task_hands_its_tools_to_a_template_that_shows_them(tmp_path, template, shown_by_template):
    from flexlamps.agents.chat import ChatTurns
    from flexlamps.agents.run import _first_prompt
    from flexlamps.agents.toolcalls import ToolUseTask

    tokenizer = tokenizer_from_hf_folder(_folder(tmp_path, template))
    task = ToolUseTask("0", "What is 2 + 3?", "tools.py", [TOOLS[0]["function"]])
    text = tokenizer.decode(_first_prompt(ChatTurns(tokenizer), task), skip_special_tokens=False)
    assert ("Tools:\n<tools>" in text) == shown_by_template  # the template's own words
    assert ("You are a function calling AI model" in text) != shown_by_template  # else our system turn
    assert '"name": "add"' in text and text.count('"name": "add"') == 1
