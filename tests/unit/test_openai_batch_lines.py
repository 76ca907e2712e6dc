"""Reading OpenAI Batch request lines (torch-free): bodies become per-line params, and every line
that cannot run becomes a record with its error instead of refusing the file."""

import json

from flexlamps.io.prompts import read_prompts


def _file(tmp_path, *lines):
    path = tmp_path / "batch.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return read_prompts(path)


def _chat(cid, **body):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}], **body}}


def test_chat_and_completion_bodies_become_params(tmp_path):
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    chat, cmpl = _file(tmp_path, _chat("c", max_completion_tokens=9, max_tokens=3, temperature=0.5, top_p=0.9,
                                       seed=4, stop="x", n=2, logprobs=True, top_logprobs=3, user="u",
                                       response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}),
                       {"custom_id": "p", "method": "POST", "url": "/v1/completions",
                        "body": {"prompt": ["one"], "logprobs": 2, "model": "m"}})
    assert chat.error is None and chat.extra == {"custom_id": "c"} and chat.n == 2
    assert chat.sampling == {"max_new_tokens": 9, "temperature": 0.5, "top_p": 0.9, "seed": 4, "stop": ("x",),
                             "logprobs": True, "top_logprobs": 3}
    assert json.loads(chat.json_schema) == schema and list(json.loads(chat.json_schema)["properties"]) == ["b", "a"]
    assert cmpl.prompt == "one" and cmpl.model == "m" and cmpl.sampling == {"logprobs": True, "top_logprobs": 2}
    assert chat.id.startswith("batch_req_") and chat.id != cmpl.id


def test_lines_that_cannot_run_carry_their_error(tmp_path):
    records = _file(tmp_path, "{broken", _chat("ok"), _chat("ok"), _chat("n", n=0), _chat("t", tools=[]),
                    _chat("f", response_format={"type": "xml"}), {"custom_id": "u", "method": "POST", "url": "/v1/embeddings", "body": {}},
                    _chat("lp", top_logprobs=2), {"custom_id": "m", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
                    _chat("pen", frequency_penalty=0.5), _chat("s", stop=["a", "b", "c", "d", "e"]))
    errors = [r.error for r in records]
    assert errors[1] is None
    assert all(e for k, e in enumerate(errors) if k != 1), errors
    assert "not JSON" in errors[0] and "already used on line 2" in errors[2] and "n 0" in errors[3]
    assert "'tools'" in errors[4] and "response_format" in errors[5] and "/v1/embeddings" in errors[6]
    assert "logprobs" in errors[7] and "messages" in errors[8] and "frequency_penalty" in errors[9] and "stop" in errors[10]
    assert len({r.id for r in records}) == len(records)  # every line keeps its own record
