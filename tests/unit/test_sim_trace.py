import json
from pathlib import Path

import pytest

from flexlamps.workloads.trace import approx_tokenize, load_templates, replay
from tests.conftest import SHARED_DATA

DATA = SHARED_DATA / "augmented"


def _write(tmp_path, obj, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_token_count_segments_and_context_growth(tmp_path):
    path = _write(tmp_path, {"m1": [
        {"prompt_tokens": 100, "completion_tokens": 10, "api_time": 1e-4, "api_token_length": 5},
        {"prompt_tokens": 115, "completion_tokens": 7},
    ]})
    (t,) = load_templates(path)
    assert t.kind == "math" and t.prompt_tokens == 100
    assert [(s.completion_tokens, s.api_type, s.api_tokens) for s in t.segments] == [(10, "math", 5), (7, None, 0)]


def test_text_segments_use_the_tokenizer_and_cap_human_turns(tmp_path):
    path = _write(tmp_path, {"c1": [
        {"prompt": "hi there", "completion": "a b c", "api_token": "more please", "api_time": 95.0},
        {"prompt": "hi therea b cmore please", "completion": "d e"},
    ]})
    (t,) = load_templates(path, tokenize=lambda s: len(s))  # a character "tokenizer"
    assert t.kind == "chatbot" and t.prompt_tokens == 8
    assert t.segments[0].completion_tokens == 5 and t.segments[0].api_tokens == 11
    assert t.segments[0].api_time == 60.0  # the papers cap a human turn at 60 s
    assert approx_tokenize("Hello, world!") == 4


def test_context_is_capped_at_the_model_length(tmp_path):
    path = _write(tmp_path, {"q": [
        {"prompt_tokens": 1000, "completion_tokens": 600, "api_time": 0.5, "api_token_length": 300},
        {"prompt_tokens": 1900, "completion_tokens": 400, "api_time": 0.5, "api_token_length": 10},
        {"prompt_tokens": 2310, "completion_tokens": 5},
    ]})
    (t,) = load_templates(path, max_model_len=2048)
    ctx = t.prompt_tokens
    for s in t.segments:
        ctx += s.completion_tokens
        assert ctx <= 2048
        ctx += s.api_tokens
    assert t.segments[-1].api_type is None and len(t.segments) == 2


@pytest.mark.parametrize("bad,msg", [
    ({"r7": [{"prompt_tokens": 5}]}, "r7"),
    ({"r8": "oops"}, "r8"),
    ([1, 2], "JSON object"),
])
def test_malformed_trace_names_file_and_request(tmp_path, bad, msg):
    path = _write(tmp_path, bad)
    with pytest.raises(ValueError) as e:
        load_templates(path)
    assert msg in str(e.value) and path in str(e.value)


def test_missing_trace_file_says_which(tmp_path):
    with pytest.raises(ValueError, match="nope.json"):
        load_templates(str(tmp_path / "nope.json"))


def test_replay_draws_4_qps_window_requests_with_poisson_arrivals(tmp_path):
    path = _write(tmp_path, {f"m{i}": [{"prompt_tokens": 10 + i, "completion_tokens": 3}] for i in range(5)})
    templates = load_templates(path)
    specs = replay(templates, qps=5.0, window=100.0, seed=1)
    assert len(specs) == 2000 and len({s.request_id for s in specs}) == 2000
    gaps = [b.arrival_time - a.arrival_time for a, b in zip(specs, specs[1:])]
    mean = sum(gaps) / len(gaps)
    assert 0.18 < mean < 0.22 and min(gaps) >= 0  # exponential gaps, mean 1 / qps
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert 0.9 < cv < 1.1
    assert replay(templates, 5.0, 100.0, seed=1)[7] == specs[7]  # seeded
    with pytest.raises(ValueError, match="qps"):
        replay(templates, 0, 10)


@pytest.mark.skipif(not DATA.exists(), reason="shared augmented traces not present")
def test_real_traces_load():
    multi = load_templates(str(DATA / "merged_exp_uniform.json"))
    single = load_templates(str(DATA / "diverse_oneapi_merged_exp_uniform.json"))
    assert len(multi) == len(single) == 397
    assert {t.kind for t in multi} == {"math", "qa", "ve", "chatbot", "image", "tts"}
    assert max(sum(1 for s in t.segments if s.api_type) for t in single) == 1
    assert sum(sum(1 for s in t.segments if s.api_type) for t in multi) / len(multi) > 3
