"""OpenAI Batch output lines: `{"id", "custom_id", "response": {"status_code", "request_id",
"body": <chat.completion | text_completion>}, "error"}`, or for a line that could not run
`{"id", "custom_id", "response": null, "error": {"code", "message"}}`.

Every field is a function of the request and its samples (`created` is the job's, fixed by the
input file), so a resumed, offloaded or Ray run writes the same bytes as one uninterrupted run.

Imports only the stdlib (torch-free).
"""

from __future__ import annotations

from typing import Any, Callable

from flexlamps.io.openai_batch import CHAT_URL
from flexlamps.io.records import PromptRecord

# the engine's finish reasons -> OpenAI's ("eos": the model ended its turn, or a schema's value closed)
_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def error_line(record: PromptRecord, code: str, message: str) -> dict[str, Any]:
    return {"id": record.id, "custom_id": record.extra.get("custom_id"), "response": None,
            "error": {"code": code, "message": message}}


def response_line(record: PromptRecord, outs: list, *, model: str, created: int,
                  token_text: Callable[[int], str]) -> dict[str, Any]:
    """The line of a request whose samples `outs` (RequestOutputs, in sample order) finished."""
    chat = record.endpoint == CHAT_URL
    choices = [_chat_choice(o, token_text) if chat else _completion_choice(o, token_text) for o in outs]
    completion_tokens = sum(len(o.token_ids) for o in outs)
    prompt_tokens = outs[0].num_prompt_tokens
    body = {"id": ("chatcmpl-" if chat else "cmpl-") + record.id.removeprefix("batch_req_"),
            "object": "chat.completion" if chat else "text_completion", "created": created, "model": model,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                          "total_tokens": prompt_tokens + completion_tokens}}
    return {"id": record.id, "custom_id": record.extra["custom_id"],
            "response": {"status_code": 200, "request_id": record.id, "body": body}, "error": None}


def _chat_choice(out, token_text) -> dict[str, Any]:
    logprobs = None
    if out.logprobs is not None:
        tops = out.top_logprobs or [[] for _ in out.token_ids]
        logprobs = {"content": [{**_token(t, lp, token_text), "top_logprobs": [_token(i, v, token_text) for i, v in top]}
                                for t, lp, top in zip(out.token_ids, out.logprobs, tops)]}
    return {"index": out.sample, "message": {"role": "assistant", "content": out.text, "refusal": None},
            "logprobs": logprobs, "finish_reason": _FINISH[out.finish_reason]}


def _completion_choice(out, token_text) -> dict[str, Any]:
    logprobs = None
    if out.logprobs is not None:
        tokens = [token_text(t) for t in out.token_ids]
        offsets = [sum(map(len, tokens[:k])) for k in range(len(tokens))]
        tops = ([{token_text(i): v for i, v in top} for top in out.top_logprobs]
                if out.top_logprobs is not None else None)
        logprobs = {"tokens": tokens, "token_logprobs": out.logprobs, "top_logprobs": tops, "text_offset": offsets}
    return {"index": out.sample, "text": out.text, "logprobs": logprobs, "finish_reason": _FINISH[out.finish_reason]}


def _token(token_id: int, logprob: float, token_text) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
