"""OpenAI Batch input lines: `{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions", "body": {...}}`, read into `PromptRecord`s.

A line that cannot run (not JSON, no custom_id, a body with a missing, mistyped or unsupported
field) becomes a record carrying its `error`: the job writes an error line for it and runs the
others. A body's sampling fields override the command's options for that line; fields it leaves
out take the command's (greedy by default, not OpenAI's temperature 1). `model` is kept and not
checked: the loaded model answers every line, and the command says so once.

Imports only the stdlib (torch-free).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from flexlamps.io.records import PromptRecord, canonical_schema

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"
MAX_N = 128  # samples of one line
MAX_STOP = 4  # OpenAI's limit
# fields accepted and left without effect on the answer (with the value that is a no-op, if any)
_IGNORED = {"user": None, "metadata": None, "store": None, "service_tier": None, "stream": False,
            "frequency_penalty": 0, "presence_penalty": 0, "echo": False, "best_of": 1}


class BodyError(ValueError):
    """A body field the line cannot run with (the message names it)."""


def is_batch_line(obj: Any) -> bool:
    """Whether a JSON line is an OpenAI Batch request (what decides the file's format)."""
    return isinstance(obj, dict) and "custom_id" in obj and "body" in obj


def request_id(custom_id: str) -> str:
    """The output line's `id` (and the record's key for resuming): stable for a custom_id."""
    return "batch_req_" + hashlib.sha256(custom_id.encode("utf-8")).hexdigest()[:24]


def read_batch_lines(path, lines: list[str]) -> list[PromptRecord]:
    """Every line of an OpenAI Batch file as a record, in order (errors recorded, not raised)."""
    records, seen = [], {}
    for n, line in enumerate(lines, 1):
        if line.strip():
            record = _read_line(line, n)
            if record.id in seen:
                record = PromptRecord(f"batch_req_line{n}", extra={"custom_id": record.extra["custom_id"]},
                                      endpoint=record.endpoint,
                                      error=f"custom_id already used on line {seen[record.id]}; custom_ids must be unique")
            seen.setdefault(record.id, n)
            records.append(record)
    return records


def _read_line(line: str, n: int) -> PromptRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return PromptRecord(f"batch_req_line{n}", extra={"custom_id": None}, endpoint=CHAT_URL,
                            error=f"line {n} is not JSON ({e.msg} at column {e.colno})")
    custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
    if not isinstance(custom_id, str) or not custom_id:
        return PromptRecord(f"batch_req_line{n}", extra={"custom_id": None}, endpoint=CHAT_URL,
                            error=f"line {n} needs a non-empty string custom_id")
    url = obj.get("url")
    record = PromptRecord(request_id(custom_id), extra={"custom_id": custom_id},
                          endpoint=url if url in (CHAT_URL, COMPLETIONS_URL) else CHAT_URL)
    try:
        _check_envelope(obj)
        _read_body(record, obj["body"])
    except BodyError as e:
        record.error = str(e)
    return record


def _check_envelope(obj: dict) -> None:
    if obj.get("method", "POST") != "POST":
        raise BodyError(f"method {obj.get('method')!r} is not supported; use \"POST\"")
    if obj.get("url") not in (CHAT_URL, COMPLETIONS_URL):
        raise BodyError(f"url {obj.get('url')!r} is not supported; use {CHAT_URL!r} or {COMPLETIONS_URL!r}")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise BodyError(f"unknown field {unknown[0]!r} in the request line")
    if not isinstance(obj["body"], dict):
        raise BodyError("body must be a JSON object")


def _read_body(record: PromptRecord, body: dict) -> None:
    body = dict(body)
    if record.endpoint == CHAT_URL:
        record.messages = _messages(body.pop("messages", None))
    else:
        record.prompt = _completion_prompt(body.pop("prompt", None))
    record.model = _typed(body, "model", str)
    record.json_schema = _response_format(body.pop("response_format", None))
    record.sampling, record.n = _sampling(body, chat=record.endpoint == CHAT_URL)
    for name, no_op in _IGNORED.items():
        value = body.pop(name, no_op)
        if no_op is not None and value not in (no_op, None):
            raise BodyError(f"{name} {value!r} is not supported (only {no_op!r})")
    if body:
        raise BodyError(f"unsupported field {sorted(body)[0]!r} in the body")


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise BodyError("a chat body needs \"messages\", a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BodyError(f"messages[{k}] needs a string \"role\"")
        out.append({**m, "content": _content(m.get("content"), k)})
    return out


def _content(content, k: int) -> str:
    """A message's text: a string, or a list of {"type": "text", "text"} parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BodyError(f"messages[{k}].content must be a string or a list of text parts")


def _completion_prompt(prompt) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BodyError("a completions body needs \"prompt\", a non-empty string (one prompt a line)")
    return prompt


def _response_format(fmt) -> str | None:
    """The JSON schema's text a `response_format` asks for; None for plain text."""
    if fmt is None or fmt == {"type": "text"}:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return canonical_schema({"type": "object"})
    if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        schema = fmt["json_schema"].get("schema")
        if isinstance(schema, dict):
            return canonical_schema(schema)
    raise BodyError("response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                    "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}")


def _sampling(body: dict, chat: bool) -> tuple[dict[str, Any], int]:
    """The body's sampling fields as SamplingParams fields (only those given), and n."""
    out: dict[str, Any] = {}
    limit = body.pop("max_tokens", None)
    if chat and body.get("max_completion_tokens") is not None:  # the newer name wins
        limit = body.pop("max_completion_tokens")
    body.pop("max_completion_tokens", None)
    if limit is not None:
        out["max_new_tokens"] = _in_range("max_tokens", limit, int, 1, None)
    if (t := body.pop("temperature", None)) is not None:
        out["temperature"] = _in_range("temperature", t, (int, float), 0, 2)
    if (p := body.pop("top_p", None)) is not None:
        out["top_p"] = _in_range("top_p", p, (int, float), 1e-9, 1)
    if (seed := body.pop("seed", None)) is not None:
        out["seed"] = _in_range("seed", seed, int, None, None)
    if (stop := body.pop("stop", None)) is not None:
        out["stop"] = _stop(stop)
    out.update(_logprobs(body, chat))
    return out, _in_range("n", body.pop("n", 1), int, 1, MAX_N)


def _logprobs(body: dict, chat: bool) -> dict[str, Any]:
    """chat: `logprobs` true/false and `top_logprobs` 0-20; completions: `logprobs` the top count 0-5."""
    logprobs, top = body.pop("logprobs", None), body.pop("top_logprobs", None) if chat else None
    if chat:
        if logprobs is not None and not isinstance(logprobs, bool):
            raise BodyError("logprobs must be true or false")
        if top is not None and not logprobs:
            raise BodyError("top_logprobs needs \"logprobs\": true")
        return {"logprobs": True, "top_logprobs": _in_range("top_logprobs", top or 0, int, 0, 20)} if logprobs else {}
    if logprobs is None:
        return {}
    return {"logprobs": True, "top_logprobs": _in_range("logprobs", logprobs, int, 0, 5)}


def _stop(stop) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise BodyError(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them")
    return tuple(stops)


def _typed(body: dict, name: str, kind):
    value = body.pop(name, None)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise BodyError(f"{name} must be a {kind.__name__}, got {value!r}")
    return value


def _in_range(name: str, value, kind, low, high):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BodyError(f"{name} must be a number, got {value!r}" if kind != int else
                        f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BodyError(f"{name} {value!r} is out of range ({low if low is not None else '-inf'} to "
                        f"{high if high is not None else 'inf'})")
    return value
