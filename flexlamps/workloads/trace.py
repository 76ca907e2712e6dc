"""The INFERCEPT augmented-request trace (as LAMPS ships it) and its replay.

File format: `{request_id: [segment, ...]}`; a segment is either token counts
`{prompt_tokens, completion_tokens[, api_time, api_token_length]}` or text
`{prompt, completion[, api_token, api_time]}` (see ../shared/data/augmented/README.md).
Text is counted with a tokenizer callable; the default `approx_tokenize` is a regex
approximation (words and punctuation), the real engine passes the serving model's tokenizer.

Replay as the papers do: `4 x qps x window` requests drawn with replacement from the
templates, Poisson arrivals at `qps`, contexts capped at the model's length.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Callable

from flexlamps.sched.request import RequestSpec, Segment

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

HUMAN_TURN_CAP_S = 60.0  # chatbot "API" = a human's reply; the papers cap it at 60 s


def approx_tokenize(text: str) -> int:
    """Token count of `text`, approximated as words plus punctuation marks."""
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class Template:
    template_id: str
    kind: str  # math, ve, qa (token counts); chatbot, image, tts (text)
    prompt_tokens: int
    segments: tuple[Segment, ...]


def _kind_of_counts(segs: list[dict]) -> str:
    times = [s["api_time"] for s in segs if "api_time" in s]
    mean = sum(times) / len(times) if times else 0.0
    # calculator calls take ~1e-4 s, virtual-environment steps ~1e-2 s, wiki QA ~0.4 s
    return "math" if mean < 1e-3 else "ve" if mean < 0.1 else "qa"


def _kind_of_text(api_token: str) -> str:
    if api_token.startswith("Generate an image"):
        return "image"
    if api_token.startswith("Convert this to text to speech"):
        return "tts"
    return "chatbot"


def _parse(path: str, tid: str, segs, tokenize: Callable[[str], int]) -> Template:
    where = f"trace {path}, request {tid!r}"
    if not isinstance(segs, list) or not segs or not all(isinstance(s, dict) for s in segs):
        raise ValueError(f"{where}: expected a non-empty list of segment objects")
    text = "prompt" in segs[0]
    kind = _kind_of_text(segs[0].get("api_token", "")) if text else _kind_of_counts(segs)
    out = []
    try:
        prompt = tokenize(segs[0]["prompt"]) if text else int(segs[0]["prompt_tokens"])
        for i, s in enumerate(segs):
            completion = tokenize(s["completion"]) if text else int(s["completion_tokens"])
            completion = max(1, completion)
            if "api_time" in s and i < len(segs) - 1:
                api_time = float(s["api_time"])
                returned = tokenize(s.get("api_token", "")) if text else int(s["api_token_length"])
                if kind == "chatbot":
                    api_time = min(api_time, HUMAN_TURN_CAP_S)
                out.append(Segment(completion, kind, api_time, returned))
            else:
                out.append(Segment(completion))
                break
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}, segment {i}: malformed ({type(e).__name__}: {e}); "
                         "see data/augmented/README.md for the two segment formats") from e
    return Template(tid, kind, max(1, prompt), tuple(out))


def cap_to_context(t: Template, max_model_len: int) -> Template:
    """Cut a template where its context would pass `max_model_len` (the last segment kept
    ends the request)."""
    prompt = min(t.prompt_tokens, max_model_len - 128)  # leave room to decode
    ctx, segs = prompt, []
    for s in t.segments:
        room = max_model_len - ctx
        if s.completion_tokens >= room or not s.api_type or ctx + s.completion_tokens + s.api_tokens >= max_model_len:
            segs.append(Segment(max(1, min(s.completion_tokens, room - 1))))
            break
        segs.append(s)
        ctx += s.completion_tokens + s.api_tokens
    return Template(t.template_id, t.kind, prompt, tuple(segs))


def load_templates(path: str, tokenize: Callable[[str], int] = approx_tokenize,
                   max_model_len: int = 2048) -> list[Template]:
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as e:
        raise ValueError(f"trace {path}: cannot read it ({e}); pass --trace with a file from "
                         "data/augmented/") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"trace {path}: not valid JSON ({e})") from e
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"trace {path}: expected a JSON object {{request_id: [segments]}}")
    return [cap_to_context(_parse(path, tid, segs, tokenize), max_model_len) for tid, segs in raw.items()]


def replay(templates: list[Template], qps: float, window: float = 1800.0, seed: int = 0,
           num_requests: int | None = None) -> list[RequestSpec]:
    """Draw `4 x qps x window` requests with replacement; Poisson arrivals at `qps`."""
    if qps <= 0 or window <= 0:
        raise ValueError(f"replay needs qps > 0 and window > 0, got qps={qps}, window={window}")
    rng = random.Random(seed)
    n = num_requests if num_requests is not None else max(1, round(4 * qps * window))
    t, specs = 0.0, []
    for i in range(n):
        t += rng.expovariate(qps)
        tpl = rng.choice(templates)
        specs.append(RequestSpec(
            request_id=f"r{i}-{tpl.template_id}",
            prompt_tokens=tpl.prompt_tokens,
            segments=tpl.segments,
            arrival_time=t,
            client_id=tpl.kind,
            kind=tpl.kind,
        ))
    return specs
