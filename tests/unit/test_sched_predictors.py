import math
import random

import pytest

from flexlamps.sched.predictors import LearnedPredictor, NoisyPredictor, OnlineRidge, OraclePredictor
from flexlamps.sched.request import Request, RequestSpec, Segment


def _req(rid, prompt, kind="math", segment_index=0, segment_output=0):
    r = Request(rid, 0.0, prompt, kind=kind)
    r.segment_index, r.segment_output = segment_index, segment_output
    r.num_tokens = prompt + segment_output
    return r


def test_oracle_reads_the_truth():
    spec = RequestSpec("a", 10, (Segment(7, "calc", 0.5, 3), Segment(4)))
    p = OraclePredictor({"a": spec})
    r = _req("a", 10, segment_output=2)
    assert p.output_tokens(r) == 5
    assert p.next_call(r) == ("calc", 0.5)
    r.segment_index, r.segment_output = 1, 0
    assert p.output_tokens(r) == 4 and p.next_call(r) == (None, 0.0)


def test_online_ridge_recovers_a_linear_rule():
    rng = random.Random(0)
    ridge = OnlineRidge(alpha=1e-3, refit_every=8)
    for _ in range(200):
        x = [1.0, rng.uniform(0, 5), rng.uniform(-1, 1)]
        ridge.add(x, 2.0 + 3.0 * x[1] - 1.0 * x[2])
    assert ridge.predict([1.0, 2.0, 0.5]) == pytest.approx(7.5, abs=0.05)


def test_learned_predictor_learns_length_from_prompt_size_and_api_means():
    p = LearnedPredictor()
    assert p.output_tokens(_req("cold", 50)) == pytest.approx(100.0)  # prior before any data
    rng = random.Random(1)
    for i in range(300):
        prompt = rng.randint(10, 2000)
        out = max(1, int(prompt / 10))  # longer prompts -> longer answers
        r = _req(f"t{i}", prompt, segment_output=out)
        p.observe_segment(r, out, "calc")
        p.observe_api("calc", 0.2 if i % 2 else 0.4)
    short, long = p.output_tokens(_req("s", 100)), p.output_tokens(_req("l", 1500))
    assert short < 30 < 80 < long
    err = abs(math.log(long / 150))
    assert err < 0.5
    assert p.api_time("calc", None) == pytest.approx(0.3)
    assert p.next_call(_req("x", 10)) == ("calc", pytest.approx(0.3))


def test_learned_predictor_takes_an_embedding_featurizer():
    calls = []

    def featurizer(req, start_tokens):  # the real engine passes the prompt embedding here
        calls.append(req.request_id)
        return [1.0, float(req.prompt_tokens % 7)]

    p = LearnedPredictor(featurizer=featurizer)
    p.observe_segment(_req("a", 9, segment_output=4), 4, None)
    p.output_tokens(_req("b", 9))
    assert calls == ["a", "b"]


def test_noise_is_multiplicative_stable_and_seeded():
    spec = RequestSpec("a", 10, (Segment(100, "calc", 2.0, 3), Segment(4)))
    base = OraclePredictor({"a": spec})
    noisy = NoisyPredictor(base, sigma=0.6, seed=7)
    r = _req("a", 10)
    first = noisy.output_tokens(r)
    assert first != 100 and first == noisy.output_tokens(r)  # same draw on re-rank
    r.segment_output = 10
    r.num_tokens += 10
    assert noisy.output_tokens(r) == pytest.approx(max(1.0, first - 10))
    factors = [NoisyPredictor(base, 0.6, seed=s).next_call(r)[1] / 2.0 for s in range(400)]
    mean = sum(factors) / len(factors)
    sd = (sum((f - mean) ** 2 for f in factors) / len(factors)) ** 0.5
    assert 0.9 < mean < 1.1 and 0.45 < sd < 0.7 and min(factors) >= 0.05


def test_future_segments_oracle_and_learned():
    spec = RequestSpec("a", 10, (Segment(7, "calc", 0.5, 3), Segment(4, "calc", 0.2, 2), Segment(9)))
    oracle = OraclePredictor({"a": spec})
    r = _req("a", 10)
    assert oracle.future_segments(r) == [(4, "calc", 0.2, 2), (9, None, 0.0, 0)]
    p = LearnedPredictor()
    assert p.future_segments(r) == []  # nothing learned yet
    for i in range(20):  # requests of this kind make 2 calls, 10 tokens per segment
        done = _req(f"d{i}", 10)
        for seg in range(3):
            done.segment_index = seg
            p.observe_segment(done, 10, "calc" if seg < 2 else None)
        p.observe_api("calc", 1.0)
    fut = p.future_segments(_req("new", 10))
    assert [(t, a) for t, a, _, _ in fut] == [(10.0, "calc"), (10.0, None)]
    assert fut[0][2] == pytest.approx(1.0)
    noisy = NoisyPredictor(oracle, 0.6, seed=3).future_segments(r)
    assert len(noisy) == 2 and noisy != oracle.future_segments(r)
