"""Tool calls in the model's own syntax (Hermes / Qwen: `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`) to the functions of a Python file, each call run in the sandbox.

The file's tools are its public functions (or those it lists in `TOOLS`); their JSON schemas are
read in the sandbox too (importing the file runs its code). A chat template that takes a `tools`
list (Qwen, Hermes, Llama 3.1...) shows them in its own words; for one that does not, a system
turn lists them the way Hermes-style templates do.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field

from flexlamps.agents.task import ToolCall
from flexlamps.tools.sandbox import Limits, ToolResult, call_function, describe_tools

SYSTEM = ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
          "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
          "about what values to plug into functions. Here are the available tools: <tools>{tools}</tools>\n"
          "For each function call return a json object with function name and arguments within <tool_call>"
          "</tool_call> XML tags as follows:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
          "<args-json-object>}}\n</tool_call>")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def load_tools(module: str, limits: Limits = Limits()) -> list[dict]:
    """The schemas of `module`'s tools; a file with none, or whose description (read from its
    own process) is not a list of schemas, is an error naming it."""
    try:
        tools = describe_tools(module, limits)
    except json.JSONDecodeError as e:  # what the module's own process left as its description
        raise ValueError(f"{module}: the description of its tools is malformed (not JSON: {e.msg}); a tool is "
                         "a public function with a plain name, a docstring and keyword parameters") from None
    if not tools:
        raise ValueError(f"{module} defines no tool: give it public functions (or a TOOLS list)")
    why = malformed_schema(tools)
    if why is not None:
        raise ValueError(f"{module}: the description of its tools is malformed ({why}); a tool is a public "
                         "function with a plain name, a docstring and keyword parameters")
    return tools


def malformed_schema(tools) -> str | None:
    """What is wrong with a tools description (not a list of {"name": identifier, "description":
    text, "parameters": {"type": "object", "properties": {...}, "required": [...]}}), or None."""
    if not isinstance(tools, list):
        return f"a list of tools expected, got {type(tools).__name__}"
    for n, tool in enumerate(tools):
        params = tool.get("parameters") if isinstance(tool, dict) else None
        if not isinstance(params, dict):
            return f"tool {n} has no \"parameters\" object"
        name, props, required = tool.get("name"), params.get("properties"), params.get("required", [])
        if not isinstance(name, str) or not name.isidentifier():
            return f"tool {n}'s name {name!r} is not an identifier"
        if not isinstance(tool.get("description", ""), str):
            return f"{name}'s description is not text"
        if not isinstance(props, dict) or not all(isinstance(p, dict) for p in props.values()):
            return f"{name}'s parameters have no \"properties\" object of schemas"
        if not isinstance(required, list) or not set(required) <= set(props):
            return f"{name}'s required parameters {required!r} are not among its properties"
    return None


def parse_call(text: str, names: set[str]) -> tuple[str, dict] | str | None:
    """The first `<tool_call>` of `text` as (name, arguments); an error message when it is
    malformed or names no tool; None when the text calls nothing."""
    m = _CALL.search(text)
    if m is None:
        return None
    try:
        call = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        return f"error: the tool call is not valid JSON ({e.msg} at column {e.colno})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'error: a tool call is a JSON object {"name": ..., "arguments": {...}}'
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if call["name"] not in names:
        return f"error: no tool named {call['name']!r}; the tools are {', '.join(sorted(names))}"
    if not isinstance(args, dict):
        return "error: a tool call's arguments are a JSON object"
    return call["name"], args


def _refused(message: str) -> ToolResult:
    return ToolResult("error", message, 0.0)


@dataclass
class ToolUseTask:
    task_id: str
    prompt: str
    module: str
    tools: list[dict]
    max_calls: int = 4
    limits: Limits = Limits()
    kind: str = "tools"
    calls: list[dict] = field(default_factory=list)
    answer: str | None = None

    @property
    def template_tools(self) -> list[dict]:
        """The tools as chat templates take them (transformers' `tools=`)."""
        return [{"type": "function", "function": t} for t in self.tools]

    def messages(self, template_shows_tools: bool = False) -> list[dict]:
        user = {"role": "user", "content": self.prompt}
        if template_shows_tools:
            return [user]
        listing = "".join("\n" + json.dumps(t) for t in self.template_tools) + "\n"
        return [{"role": "system", "content": SYSTEM.format(tools=listing)}, user]

    def segment_done(self, text: str) -> bool:
        return "</tool_call>" in text

    def end_segment(self, text: str) -> ToolCall | None:
        parsed = parse_call(text, {t["name"] for t in self.tools})
        if parsed is None or len(self.calls) >= self.max_calls:
            self.answer = text
            return None
        if isinstance(parsed, str):
            self.calls.append({"text": text, "name": None, "arguments": None})
            return ToolCall("invalid_call", functools.partial(_refused, parsed))
        name, args = parsed
        self.calls.append({"text": text, "name": name, "arguments": args})
        return ToolCall(name, functools.partial(call_function, self.module, name, args, self.limits))

    def tool_turn(self, call: ToolCall, result: ToolResult, can_continue: bool) -> tuple[str, str] | None:
        text = result.text(self.limits.max_chars)
        self.calls[-1].update(result=text, status=result.status, tool_seconds=result.seconds)
        return ("tool", text) if can_continue else None

    def record(self) -> dict:
        return {"task_id": self.task_id, "prompt": self.prompt, "calls": self.calls, "answer": self.answer}


def tool_score(tasks: list[ToolUseTask]) -> dict:
    """How the tasks used their tools: calls that ran, calls the sandbox refused or failed."""
    calls = [c for t in tasks for c in t.calls]
    return {"calls_ok": sum(c.get("status") == "ok" for c in calls),
            "calls_failed": sum(c.get("status") not in (None, "ok") for c in calls),
            "answered": sum(t.answer is not None for t in tasks)}
