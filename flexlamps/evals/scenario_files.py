"""What a scenario reads of the user's input: `ScenarioError` (a name, an argument or a file that
cannot be loaded, one line naming it) and JSONL files read with the line of any fault. Shared by
the built-in scenarios (scenarios.py) and the user's own files (custom_file.py)."""

from __future__ import annotations

from pathlib import Path

from flexlamps.io.jsonl import json_objects


class ScenarioError(ValueError):
    """A scenario that cannot be loaded because of the user's input (name, args, files)."""


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(line number, JSON object) pairs, one object a line; a malformed line is reported with file and line number."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise ScenarioError(f"{path}: cannot read it ({why}); give a JSONL file, one JSON object a line") from None
    def error(n: int, problem: str) -> ScenarioError:
        return ScenarioError(f"{path}:{n}: {problem}; fix or remove that line")

    return list(json_objects(lines, error))
