"""JSONL lines as JSON objects, a fault named by its line: the one walk the prompt files and the
evaluation files share, each raising its own error type with its own fix."""

from __future__ import annotations

import json
from typing import Callable, Iterable, Iterator


def json_objects(lines: Iterable[str], error: Callable[[int, str], Exception]) -> Iterator[tuple[int, dict]]:
    """(line number from 1, object) of each non-blank line; a line that is not one JSON object
    raises `error(line number, what is wrong with it)`."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line.rstrip("\r\n"))  # a column of this line, not of the next
        except json.JSONDecodeError as e:
            raise error(n, f"not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise error(n, f"expected a JSON object, got {type(obj).__name__}")
        yield n, obj
