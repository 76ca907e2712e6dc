"""Read prompt files: JSONL records `{"id": ..., "prompt": ...}` (extra fields kept) or plain text,
one prompt per line. Errors name the file, the line and the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class PromptFileError(ValueError):
    pass


@dataclass
class PromptRecord:
    id: str
    prompt: str
    extra: dict[str, Any] = field(default_factory=dict)


def _is_jsonl(path: Path, lines: list[str]) -> bool:
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return True
    first = next((ln for ln in lines if ln.strip()), "")
    return first.lstrip().startswith("{")


def read_prompts(path: str | Path) -> list[PromptRecord]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"prompt file {path} does not exist") from None
    except OSError as e:  # under a file, unreadable, a special file
        raise PromptFileError(f"--prompts {path} cannot be read ({e.strerror}); check the path") from None
    except UnicodeDecodeError as e:
        raise PromptFileError(f"prompt file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = text.splitlines()
    records = _read_jsonl(path, lines) if _is_jsonl(path, lines) else _read_text(lines)
    if not records:
        raise PromptFileError(f"prompt file {path} holds no prompts")
    return records


def _read_text(lines: list[str]) -> list[PromptRecord]:
    # the id of a text prompt is its 1-based line number, stable when the file is re-read
    return [PromptRecord(str(n), ln) for n, ln in enumerate(lines, 1) if ln.strip()]


def _read_jsonl(path: Path, lines: list[str]) -> list[PromptRecord]:
    records, seen = [], {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{n}: malformed JSON ({e.msg} at column {e.colno}); "
                                  "each line must be one JSON object like {\"id\": 1, \"prompt\": \"...\"}") from None
        if not isinstance(obj, dict):
            raise PromptFileError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
        prompt = obj.pop("prompt", None)
        if not isinstance(prompt, str) or not prompt:
            raise PromptFileError(f"{path}:{n}: needs a non-empty string field \"prompt\"")
        rid = str(obj.pop("id", n))
        if rid in seen:
            raise PromptFileError(f"{path}:{n}: id {rid!r} already used on line {seen[rid]}; ids must be unique")
        seen[rid] = n
        records.append(PromptRecord(rid, prompt, obj))
    return records
