"""What a run of augmented requests records, whether simulated or on the real engine: one
`RequestRecord` per finished request and the run's `SimStats` counters."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    request_id: str
    kind: str
    client_id: str
    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    api_seconds: float
    num_calls: int

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def normalized(self) -> float:
        """(E2E - time spent inside API calls) per output token."""
        return (self.e2e - self.api_seconds) / max(1, self.output_tokens)


@dataclass
class SimStats:
    iterations: int = 0  # engine iterations simulated (fast-forwarded ones included)
    schedule_calls: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    recompute_tokens: int = 0
    decode_tokens: int = 0
    swap_tokens: int = 0
    preemptions: int = 0
    waiting_s: float = 0.0  # request x seconds spent queued (waiting or swapped, not in a call)
    strategies: dict = field(default_factory=lambda: {"preserve": 0, "swap": 0, "discard": 0})
    end_time: float = 0.0
