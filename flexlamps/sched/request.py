"""Augmented requests: a prompt, then decode / API-call segments, and their scheduler state."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Segment:
    """One decode-then-intercept step: generate `completion_tokens`, then (if `api_type`) pause
    for `api_time` seconds and append `api_tokens` returned tokens to the context."""

    completion_tokens: int
    api_type: str | None = None
    api_time: float = 0.0
    api_tokens: int = 0


@dataclass
class RequestSpec:
    """What a workload knows about a request (the simulator's ground truth)."""

    request_id: str
    prompt_tokens: int
    segments: tuple[Segment, ...]
    arrival_time: float = 0.0
    client_id: str = "default"
    kind: str = "unknown"  # augmentation kind (math, qa, ve, chatbot, image, tts)

    @property
    def output_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.segments)

    @property
    def api_seconds(self) -> float:
        return sum(s.api_time for s in self.segments if s.api_type)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "RequestSpec":
        d = dict(d)
        d["segments"] = tuple(Segment(**s) for s in d["segments"])
        return cls(**d)


class Status(enum.Enum):
    WAITING = "waiting"  # needs admission: new, discarded during a call, or preempted
    RUNNING = "running"  # cache on the gpu tier; prefilling or decoding
    PAUSED = "paused"  # inside an API call
    SWAPPED = "swapped"  # call returned, cache still on the cpu tier, waiting for swap-in
    FINISHED = "finished"


class Strategy(enum.Enum):
    PRESERVE = "preserve"
    SWAP = "swap"
    DISCARD = "discard"


@dataclass(eq=False)
class Request:
    """Scheduler-side state of one request. Token accounting follows vLLM: `num_tokens` counts
    prompt + sampled + returned tokens; `num_computed` counts those whose KV is in the cache.
    While decoding, num_computed == num_tokens - 1 (the newest sampled token is not cached yet)."""

    request_id: str
    arrival_time: float
    prompt_tokens: int
    client_id: str = "default"
    kind: str = "unknown"  # the tool kind this request calls; lets predictors key API durations

    status: Status = Status.WAITING
    num_tokens: int = 0
    num_computed: int = 0
    segment_index: int = 0  # how many API calls have returned so far
    segment_output: int = 0  # tokens sampled in the current segment
    output_tokens: int = 0  # tokens sampled over the whole request
    strategy: Strategy | None = None  # what was done with the cache during the current call
    api_type: str | None = None  # type of the call in progress
    api_start: float = 0.0
    queue_time: float = 0.0  # when it last joined the waiting queue (vLLM re-queues at the tail)
    first_token_time: float | None = None
    passed_over: int = 0  # iterations a later-arrived request was admitted before it
    queue_stays: int = 0  # how many times it joined the queue (tells stale starvation entries)
    queued_at: float = 0.0  # when it last joined the queue (arrival, return, preemption)
    starve_since: int = 0  # iteration its starvation count began (LAMPS's per-iteration counter)
    promoted: bool = False
    served_tokens: float = 0.0  # VTC service counter contribution
    mlfq_level: int = 0
    mlfq_used: int = 0  # iterations used in the current MLFQ level
    rank_cache: float | None = field(default=None, repr=False)
    sort_key: tuple | None = field(default=None, repr=False)  # cached queue order while waiting
    admit_need: int = 0  # gpu blocks needed to admit it from the queue

    def __post_init__(self):
        if self.num_tokens == 0:
            self.num_tokens = self.prompt_tokens
        self.queue_time = self.arrival_time

    @property
    def tokens_to_compute(self) -> int:
        """Tokens to run through the model before the next token can be sampled (1 = a decode
        step; more = a prompt, returned API tokens, or a discarded context to recompute)."""
        return self.num_tokens - self.num_computed
