"""Read prompt files: JSONL records `{"id": ..., "prompt": ...}` or `{"id": ..., "messages": [...]}`
(an optional `json_schema` the answer must follow and `n` samples; other fields kept), OpenAI Batch files
(`openai_batch`, recognised by the first line's `custom_id` and `body`) or plain text, one prompt
per line. Errors name the file, the line and the fix."""

from __future__ import annotations

import json
from pathlib import Path

from flexlamps.io.jsonl import json_objects
from flexlamps.io.openai_batch import MAX_N, is_batch_line, read_batch_lines
from flexlamps.io.records import PromptRecord, canonical_schema

__all__ = ["PromptFileError", "PromptRecord", "read_prompts"]


class PromptFileError(ValueError):
    pass


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
    if not _is_jsonl(path, lines):
        records = _read_text(lines)
    elif _first_is_batch_line(lines):
        records = read_batch_lines(path, lines)
    else:
        records = _read_jsonl(path, lines)
    if not records:
        raise PromptFileError(f"prompt file {path} holds no prompts")
    return records


def _first_is_batch_line(lines: list[str]) -> bool:
    """Whether the first line that is JSON is an OpenAI Batch request (a broken line before it
    then becomes that file's error line, not a refusal of the file)."""
    for line in lines:
        try:
            return is_batch_line(json.loads(line))
        except json.JSONDecodeError:
            continue
    return False


def _read_text(lines: list[str]) -> list[PromptRecord]:
    # the id of a text prompt is its 1-based line number, stable when the file is re-read
    return [PromptRecord(str(n), ln) for n, ln in enumerate(lines, 1) if ln.strip()]


def _read_jsonl(path: Path, lines: list[str]) -> list[PromptRecord]:
    def error(n: int, problem: str) -> PromptFileError:
        return PromptFileError(f"{path}:{n}: {problem}; each line must be one JSON object like "
                               "{\"id\": 1, \"prompt\": \"...\"}")

    records, seen = [], {}
    for n, obj in json_objects(lines, error):
        record = _plain_record(path, n, obj)
        if record.id in seen:
            raise PromptFileError(f"{path}:{n}: id {record.id!r} already used on line {seen[record.id]}; ids must be unique")
        seen[record.id] = n
        records.append(record)
    return records


def _plain_record(path: Path, line_no: int, obj: dict) -> PromptRecord:
    prompt, messages, schema = obj.pop("prompt", None), obj.pop("messages", None), obj.pop("json_schema", None)
    where = f"{path}:{line_no}"
    if messages is not None:
        if prompt is not None:
            raise PromptFileError(f"{where}: give \"prompt\" or \"messages\", not both")
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise PromptFileError(f"{where}: \"messages\" must be a non-empty list of "
                                  "{\"role\": ..., \"content\": \"...\"} objects")
    elif not isinstance(prompt, str) or not prompt:
        raise PromptFileError(f"{where}: needs a non-empty string field \"prompt\" (or \"messages\")")
    if schema is not None and not isinstance(schema, dict):
        raise PromptFileError(f"{where}: \"json_schema\" must be a JSON schema object")
    return PromptRecord(str(obj.pop("id", line_no)), prompt, obj, messages=messages, n=_samples(where, obj.pop("n", 1)),
                        json_schema=None if schema is None else canonical_schema(schema))


def _samples(where: str, n) -> int:
    """A plain line's `n`: how many samples of its prompt to generate (1 to MAX_N)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise PromptFileError(f"{where}: \"n\" (samples of the prompt) must be an integer from 1 to {MAX_N}, "
                              f"got {json.dumps(n)}")
    return n
