"""Predictors of what a request will do next: how many tokens it decodes before its next API
call (or its end), and which call follows and for how long.

- `OraclePredictor`: reads the ground truth (for studies and upper bounds).
- `LearnedPredictor`: output length from a ridge regression on prompt features, trained online
  from finished segments; API duration as a running mean per API type (LAMPS's choice).
  The real engine passes its own `featurizer` (e.g. the model's mean-pooled prompt embedding).
- `NoisyPredictor`: wraps another, multiplying each prediction by max(0.05, 1 + sigma * z),
  z ~ N(0, 1) drawn once per (request, segment) so re-ranking sees a stable error.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import defaultdict
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from flexlamps.sched.request import Request, RequestSpec


class Predictor(Protocol):
    def output_tokens(self, req: Request) -> float:
        """Tokens `req` will still sample before its next call or its end."""

    def next_call(self, req: Request) -> tuple[str | None, float]:
        """(API type, seconds) of the call ending the current segment; (None, 0.0) if none."""

    def api_time(self, api_type: str | None, req: Request) -> float:
        """Expected duration of a call of `api_type` that `req` has just made."""

    def future_segments(self, req: Request) -> list[tuple[float, str | None, float, float]]:
        """Segments after the current one: (output tokens, API type, API seconds, returned
        tokens) each; [] when the request is expected to end with its current segment."""

    def observe_segment(self, req: Request, segment_output: int, api_type: str | None) -> None:
        """Learn from a segment of `req` that just ended (in a call of `api_type`, or the end)."""

    def observe_api(self, api_type: str, seconds: float) -> None:
        """Learn from a call that just returned."""


class OraclePredictor:
    def __init__(self, specs: Mapping[str, RequestSpec]):
        self.specs = specs

    def _segment(self, req: Request):
        segs = self.specs[req.request_id].segments
        return segs[min(req.segment_index, len(segs) - 1)]

    def output_tokens(self, req: Request) -> float:
        return max(0, self._segment(req).completion_tokens - req.segment_output)

    def next_call(self, req: Request) -> tuple[str | None, float]:
        seg = self._segment(req)
        return (seg.api_type, seg.api_time) if seg.api_type else (None, 0.0)

    def api_time(self, api_type: str | None, req: Request) -> float:
        return self._segment(req).api_time

    def future_segments(self, req: Request):
        segs = self.specs[req.request_id].segments[req.segment_index + 1:]
        return [(s.completion_tokens, s.api_type, s.api_time, s.api_tokens) for s in segs]

    def observe_segment(self, req, segment_output, api_type):
        pass

    def observe_api(self, api_type, seconds):
        pass


def default_features(req: Request, segment_start_tokens: int) -> list[float]:
    """Plain prompt features: sizes, position in the conversation, and the request's kind."""
    kind = zlib.crc32(req.kind.encode()) % 8
    onehot = [0.0] * 8
    onehot[kind] = 1.0
    return [
        1.0,
        math.log1p(segment_start_tokens),
        math.log1p(req.prompt_tokens),
        min(req.segment_index, 16) / 16,
        *onehot,
    ]


class OnlineRidge:
    """Ridge regression y ~ X w kept as sufficient statistics (X'X, X'y); refit every n samples."""

    def __init__(self, alpha: float = 1.0, refit_every: int = 32):
        self.alpha, self.refit_every = alpha, refit_every
        self.xtx = self.xty = self.w = None
        self.n = 0
        self._since_fit = 0

    def add(self, x: Sequence[float], y: float) -> None:
        x = np.asarray(x, dtype=float)
        if self.xtx is None:
            self.xtx = np.zeros((x.size, x.size))
            self.xty = np.zeros(x.size)
        self.xtx += np.outer(x, x)
        self.xty += y * x
        self.n += 1
        self._since_fit += 1
        if self.w is None or self._since_fit >= self.refit_every:
            self.fit()

    def fit(self) -> None:
        a = self.xtx + self.alpha * np.eye(self.xtx.shape[0])
        self.w = np.linalg.solve(a, self.xty)
        self._since_fit = 0

    def predict(self, x: Sequence[float]) -> float | None:
        return None if self.w is None else float(np.dot(self.w, x))


class LearnedPredictor:
    def __init__(
        self,
        featurizer: Callable[[Request, int], Sequence[float]] = default_features,
        default_output: float = 100.0,
        default_api_time: float = 1.0,
        alpha: float = 1.0,
    ):
        self.featurizer = featurizer
        self.default_output = default_output
        self.default_api_time = default_api_time
        self.ridge = OnlineRidge(alpha=alpha)
        self._api_sum: dict[str, float] = defaultdict(float)
        self._api_n: dict[str, int] = defaultdict(int)
        # per request kind: how often a segment ends in a call, and with which API type
        self._calls: dict[str, int] = defaultdict(int)
        self._ends: dict[str, int] = defaultdict(int)
        self._kind_api: dict[str, str] = {}
        self._cache: dict[tuple[str, int], float] = {}
        # per request kind: calls per finished request, tokens per segment (running sums)
        self._kind_calls: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        self._kind_out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

    def _segment_start(self, req: Request) -> int:
        return req.num_tokens - req.segment_output

    def output_tokens(self, req: Request) -> float:
        key = (req.request_id, req.segment_index)
        total = self._cache.get(key)
        if total is None:
            y = self.ridge.predict(self.featurizer(req, self._segment_start(req)))
            total = self.default_output if y is None else math.expm1(min(max(y, 0.0), 9.0))
            self._cache[key] = total
        return max(1.0, total - req.segment_output)

    def next_call(self, req: Request) -> tuple[str | None, float]:
        calls, ends = self._calls[req.kind], self._ends[req.kind]
        # until seen otherwise, assume a call follows (augmented requests mostly continue)
        if calls + ends and calls / (calls + ends) < 0.5:
            return None, 0.0
        api_type = self._kind_api.get(req.kind, req.kind)
        return api_type, self.api_time(api_type, req)

    def api_time(self, api_type: str | None, req: Request) -> float:
        n = self._api_n.get(api_type or "", 0)
        return self._api_sum[api_type or ""] / n if n else self.default_api_time

    def future_segments(self, req: Request):
        calls, n = self._kind_calls[req.kind]
        out, m = self._kind_out[req.kind]
        if not n or not m:
            return []
        left = int(round(calls / n - req.segment_index))
        api_type = self._kind_api.get(req.kind, req.kind)
        seg = (out / m, api_type, self.api_time(api_type, req), 0.0)
        return [seg] * max(0, left - 1) + [(out / m, None, 0.0, 0.0)] * (left > 0)

    def observe_segment(self, req, segment_output, api_type):
        self._cache.pop((req.request_id, req.segment_index), None)
        start = req.num_tokens - segment_output
        self.ridge.add(self.featurizer(req, start), math.log1p(segment_output))
        stat = self._kind_out[req.kind]
        stat[0] += segment_output
        stat[1] += 1
        if api_type:
            self._calls[req.kind] += 1
            self._kind_api[req.kind] = api_type
        else:
            self._ends[req.kind] += 1
            stat = self._kind_calls[req.kind]
            stat[0] += req.segment_index
            stat[1] += 1

    def observe_api(self, api_type, seconds):
        self._api_sum[api_type] += seconds
        self._api_n[api_type] += 1


class NoisyPredictor:
    def __init__(self, base: Predictor, sigma: float, seed: int = 0):
        self.base, self.sigma, self.seed = base, sigma, seed

    def _factor(self, req: Request, what: str) -> float:
        key = f"{self.seed}/{req.request_id}/{req.segment_index}/{what}".encode()
        z = random.Random(zlib.crc32(key)).gauss(0.0, 1.0)
        return max(0.05, 1.0 + self.sigma * z)

    def output_tokens(self, req: Request) -> float:
        left = self.base.output_tokens(req)
        # noise applies to the segment's total length, so it stays stable while decoding
        total = (left + req.segment_output) * self._factor(req, "out")
        return max(1.0, total - req.segment_output)

    def next_call(self, req: Request) -> tuple[str | None, float]:
        api_type, t = self.base.next_call(req)
        return api_type, t * self._factor(req, "api")

    def api_time(self, api_type: str | None, req: Request) -> float:
        return self.base.api_time(api_type, req) * self._factor(req, "api")

    def future_segments(self, req: Request):
        out = []
        for j, (tokens, api_type, api_s, ret) in enumerate(self.base.future_segments(req)):
            out.append((max(1.0, tokens * self._factor(req, f"out+{j}")), api_type,
                        api_s * self._factor(req, f"api+{j}"), ret))
        return out

    def observe_segment(self, req, segment_output, api_type):
        self.base.observe_segment(req, segment_output, api_type)

    def observe_api(self, api_type, seconds):
        self.base.observe_api(api_type, seconds)
