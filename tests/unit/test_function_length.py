"""No function in the product is over 60 lines (def to its last line, docstring included): a
longer one does several jobs, and gets split into functions whose names say them."""

import ast

from tests.conftest import REPO

MAX_LINES = 60


def long_functions(roots=("flexlamps", "placement", "offload", "quant")) -> list[str]:
    found = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_60_lines():
    assert long_functions() == []
