"""Live tools: Python callables an augmented request calls when the model emits a tool-call
pattern. The engine scans each request's new text with `ToolDetector.find`; a hit pauses the
request (an interception) while the tool runs, and the tool's reply is appended to its context.

Pattern (Toolformer / INFERCEPT's calculator style): `[Calculator(2 * (3 + 4))]` or
`<<calc: 2 * (3 + 4)>>`. Arithmetic is evaluated by walking Python's AST over a whitelist of
number literals and operators, never with eval().
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from typing import Callable

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp, "abs": abs, "round": round}
_MAX_POW = 1000  # keep 9**9**9 from eating the machine


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression; returns the result, or 'error: ...' for bad input."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _eval(tree.body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(round(value, 10) if isinstance(value, float) else value)


def _eval(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POW:
            raise ValueError(f"exponent {right} too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS \
            and not node.keywords:
        return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
    raise ValueError(f"unsupported expression element {ast.dump(node)[:40]}")


@dataclass(frozen=True)
class ToolCall:
    tool: str  # registered tool name, e.g. "calculator"
    argument: str
    start: int  # span of the pattern in the scanned text
    end: int


class ToolDetector:
    """Finds tool-call patterns in generated text and runs the matching callable."""

    DEFAULT_PATTERNS = {
        "calculator": (r"\[Calculator\((?P<arg>[^\[\]]*?)\)\]", r"<<calc:(?P<arg>[^<>]*?)>>"),
    }

    def __init__(self, tools: dict[str, Callable[[str], str]] | None = None,
                 patterns: dict[str, tuple[str, ...]] | None = None):
        self.tools = tools if tools is not None else {"calculator": calculator}
        raw = patterns if patterns is not None else self.DEFAULT_PATTERNS
        missing = set(raw) - set(self.tools)
        if missing:
            raise ValueError(f"tool patterns for {sorted(missing)} have no callable; register them in `tools`")
        self._patterns = [(name, re.compile(p)) for name, ps in raw.items() for p in ps]

    def find(self, text: str, start: int = 0) -> ToolCall | None:
        """The first complete tool call in text[start:], or None."""
        best = None
        for name, pattern in self._patterns:
            m = pattern.search(text, start)
            if m and (best is None or m.start() < best.start):
                best = ToolCall(name, m.group("arg").strip(), m.start(), m.end())
        return best

    def run(self, call: ToolCall) -> str:
        return self.tools[call.tool](call.argument)
