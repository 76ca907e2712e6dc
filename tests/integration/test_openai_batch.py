"""`flexlamps generate` on an OpenAI Batch file: chat and completions lines with system prompts,
few-shot turns, per-line schemas and n. Every output line is an OpenAI batch output line, in
input order; schema answers validate; broken lines are error lines and the rest complete; a
killed and resumed run and an offloaded one write the same file; `messages` equal `--chat`."""

import json
import os
import signal
import subprocess
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from flexlamps.cli import main
from flexlamps.fault_points import kill_at

CHAT, CMPL = "/v1/chat/completions", "/v1/completions"
SCHEMAS = {
    "enum": {"type": "object", "properties": {"label": {"enum": ["positive", "negative"]}, "sure": {"type": "boolean"}},
             "required": ["label", "sure"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {"who": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 4}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"], "additionalProperties": False}}, "required": ["who"], "additionalProperties": False},
    "array": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                                         "minItems": 1, "maxItems": 2}},
              "required": ["tags"], "additionalProperties": False},
}
FEW_SHOT = [{"role": "system", "content": "Label the sentiment."}, {"role": "user", "content": "I love it"},
            {"role": "assistant", "content": "positive"}]
# one OpenAI batch output line, as the Batch API documents it
OUTPUT_LINE = {
    "type": "object", "required": ["id", "custom_id", "response", "error"],
    "properties": {
        "id": {"type": "string"}, "custom_id": {"type": "string"},
        "response": {"oneOf": [{"type": "null"}, {"type": "object", "required": ["status_code", "request_id", "body"],
                                                   "properties": {"status_code": {"const": 200}}}]},
        "error": {"oneOf": [{"type": "null"}, {"type": "object", "required": ["code", "message"]}]}}}
CHOICE = {"type": "object", "required": ["index", "finish_reason", "logprobs"],
          "properties": {"finish_reason": {"enum": ["stop", "length"]}}}


def _line(cid, url, **body):
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def _fmt(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


LINES = [
    _line("few-shot", CHAT, model="gpt-4o-mini", messages=[*FEW_SHOT, {"role": "user", "content": "I hate it"}],
          max_tokens=6),
    _line("enum", CHAT, messages=[*FEW_SHOT, {"role": "user", "content": "so good"}], response_format=_fmt("enum"),
          max_completion_tokens=60),
    _line("nested-n3", CHAT, messages=[{"role": "user", "content": "who?"}], response_format=_fmt("nested"), n=3,
          temperature=0.9, seed=11, max_tokens=60),
    _line("broken", CHAT, messages="not a list"),
    _line("cmpl-n2", CMPL, prompt="Once upon a time", max_tokens=5, n=2, temperature=1.0, logprobs=2),
    _line("array", CMPL, prompt="tags:", response_format=_fmt("array"), max_tokens=60),
    _line("unknown", CHAT, messages=[{"role": "user", "content": "hi"}], tools=[]),
    _line("json-object-logprobs", CHAT, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2,
          response_format={"type": "json_object"}, max_tokens=8, stop=["\n"]),
    _line("cut", CHAT, messages=[{"role": "user", "content": "who?"}], response_format=_fmt("nested"), max_tokens=3),
    _line("too-long", CMPL, prompt="the quick brown fox " * 60, max_tokens=4),
    _line("bad-schema", CHAT, messages=[{"role": "user", "content": "hi"}],
          response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}),
]
ERRORS = {"broken": "invalid_request", "unknown": "invalid_request", "too-long": "context_length_exceeded",
          "bad-schema": "invalid_json_schema"}


@pytest.fixture(scope="module")
def batch_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("openai") / "batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    return path


def _args(model, prompts, out, *more):
    return ["generate", "--no-progress", "--model", str(model), "--prompts", str(prompts), "--out", str(out),
            "--batch-size", "3", *more]


@pytest.fixture(scope="module")
def reference(tiny_llama, batch_file):
    out = batch_file.parent / "ref.jsonl"
    res = CliRunner().invoke(main, _args(tiny_llama, batch_file, out), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "4 prompts cannot run" in res.output and "gpt-4o-mini" in res.output  # errors and the model note
    return out


def _read(path):
    return [json.loads(ln) for ln in open(path)]


def test_every_line_is_a_batch_output_line_in_input_order(reference):
    rows = _read(reference)
    assert [r["custom_id"] for r in rows] == [line["custom_id"] for line in LINES]
    for row, line in zip(rows, LINES):
        jsonschema.validate(row, OUTPUT_LINE)
        if row["custom_id"] in ERRORS:
            assert row["response"] is None and row["error"]["code"] == ERRORS[row["custom_id"]]
            continue
        body = line["body"]
        assert row["error"] is None
        out = row["response"]["body"]
        assert out["object"] == ("chat.completion" if line["url"] == CHAT else "text_completion")
        assert len(out["choices"]) == body.get("n", 1) and [c["index"] for c in out["choices"]] == list(range(body.get("n", 1)))
        for choice in out["choices"]:
            jsonschema.validate(choice, CHOICE)
        usage = out["usage"]
        assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def _answers(row):
    body = row["response"]["body"]
    return [(c["message"]["content"] if "message" in c else c["text"], c["finish_reason"]) for c in body["choices"]]


def test_schema_answers_parse_and_validate(reference):
    rows = {r["custom_id"]: r for r in _read(reference)}
    for cid, name in [("enum", "enum"), ("nested-n3", "nested"), ("array", "array")]:
        for text, finish in _answers(rows[cid]):
            assert finish == "stop", text
            jsonschema.validate(json.loads(text), SCHEMAS[name])
    text, finish = _answers(rows["cut"])[0]
    assert finish == "length"  # 3 tokens do not close the object: the text is cut, as the finish reason says
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    text, _ = _answers(rows["json-object-logprobs"])[0]
    assert isinstance(json.loads(text), dict)
    content = rows["json-object-logprobs"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(content) == rows["json-object-logprobs"]["response"]["body"]["usage"]["completion_tokens"]
    assert content and all(len(t["top_logprobs"]) == 2 for t in content)
    cmpl = rows["cmpl-n2"]["response"]["body"]["choices"]
    assert all(len(c["logprobs"]["tokens"]) == 5 for c in cmpl) and cmpl[0]["text"] != cmpl[1]["text"]


@pytest.mark.slow
@pytest.mark.ci
def test_killed_and_resumed_and_offloaded_write_the_same_file(tiny_llama, batch_file, reference, tmp_path):
    cmd = [sys.executable, "-m", "flexlamps.cli", *_args(tiny_llama, batch_file, tmp_path / "out.jsonl")]
    killed = subprocess.run(cmd, env={**os.environ, **kill_at("record", 6)}, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    assert (tmp_path / "out.jsonl").read_bytes() == reference.read_bytes()
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 2, "num_gpu_batches": 2, "weights": {"gpu": 0.2, "cpu": 0.3, "disk": 0.5},
        "cache": {"gpu": 0.5, "cpu": 0.5, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    off = tmp_path / "off.jsonl"
    res = CliRunner().invoke(main, _args(tiny_llama, batch_file, off, "--gpu-mem", "64MiB", "--cpu-mem", "64MiB",
                                         "--offload-dir", str(tmp_path / "dir"), "--policy", str(policy)))
    assert res.exit_code == 0, res.output
    assert off.read_bytes() == reference.read_bytes()  # fingerprints too: a placement is not an option


def test_strict_refuses_a_file_with_a_broken_line(tiny_llama, batch_file, tmp_path):
    res = CliRunner().invoke(main, _args(tiny_llama, batch_file, tmp_path / "o.jsonl", "--strict"))
    assert res.exit_code != 0 and "'broken'" in res.output and "messages" in res.output
    assert not (tmp_path / "o.jsonl").exists()


def test_messages_line_equals_chat_prompt_and_chat_body(tiny_llama, tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "prompt": "hello there"}) + "\n")
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hello there"}]}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(_line("a", CHAT, messages=[{"role": "user", "content": "hello there"}],
                                                       max_tokens=12)) + "\n")
    texts = []
    for name, more in [("p", ["--chat"]), ("m", []), ("b", [])]:
        res = CliRunner().invoke(main, _args(tiny_llama, tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out",
                                             "--max-new-tokens", "12", *more))
        assert res.exit_code == 0, res.output
        row = _read(tmp_path / f"{name}.out")[0]
        texts.append(row["text"] if "text" in row else row["response"]["body"]["choices"][0]["message"]["content"])
    assert texts[0] == texts[1] == texts[2] and texts[0]


def test_plain_lines_take_a_schema_per_line_or_one_for_all(tiny_llama, tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SCHEMAS["enum"]))
    (tmp_path / "in.jsonl").write_text(
        json.dumps({"id": "own", "prompt": "x", "json_schema": SCHEMAS["array"]}) + "\n"
        + json.dumps({"id": "all", "messages": [{"role": "user", "content": "y"}]}) + "\n")
    res = CliRunner().invoke(main, _args(tiny_llama, tmp_path / "in.jsonl", tmp_path / "o.jsonl", "--json-schema",
                                         str(tmp_path / "s.json"), "--max-new-tokens", "60"))
    assert res.exit_code == 0, res.output
    own, everyone = _read(tmp_path / "o.jsonl")
    jsonschema.validate(json.loads(own["text"]), SCHEMAS["array"])
    jsonschema.validate(json.loads(everyone["text"]), SCHEMAS["enum"])
    (tmp_path / "bad.json").write_text("[1, 2")
    res = CliRunner().invoke(main, _args(tiny_llama, tmp_path / "in.jsonl", tmp_path / "o2.jsonl", "--json-schema",
                                         str(tmp_path / "bad.json")))
    assert res.exit_code != 0 and "--json-schema" in res.output and "is not JSON" in res.output


def test_plain_lines_take_n_samples(tiny_llama, tmp_path):
    """A plain line's `n` gives its `samples`, sample 0 the line's own answer without `n`; the
    other samples seed from it and their index, so they differ when sampled."""
    (tmp_path / "n.jsonl").write_text(json.dumps({"id": "a", "prompt": "Once upon a time", "n": 3, "tag": 1}) + "\n"
                                      + json.dumps({"id": "b", "prompt": "hello", "n": 1}) + "\n")
    (tmp_path / "one.jsonl").write_text(json.dumps({"id": "a", "prompt": "Once upon a time", "tag": 1}) + "\n")
    sampled = ["--temperature", "1.0", "--max-new-tokens", "5", "--ignore-eos", "--logprobs"]
    for name in ("n", "one"):
        res = CliRunner().invoke(main, _args(tiny_llama, tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out", *sampled))
        assert res.exit_code == 0, res.output
    (three, one), alone = _read(tmp_path / "n.out"), _read(tmp_path / "one.out")[0]
    assert sorted(three) == ["fingerprint", "id", "num_prompt_tokens", "samples", "tag"] and len(three["samples"]) == 3
    assert three["num_prompt_tokens"] == alone["num_prompt_tokens"]
    assert three["samples"][0] == {k: alone[k] for k in three["samples"][0]}
    assert all(len(s["token_ids"]) == len(s["logprobs"]) == s["num_generated_tokens"] == 5 for s in three["samples"])
    assert len({s["text"] for s in three["samples"]}) > 1
    assert "samples" not in one and one["num_generated_tokens"] == 5  # n: 1 keeps the one-sample record
