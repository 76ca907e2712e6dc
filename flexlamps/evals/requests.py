"""HELM's request-side records (`Request`, `RequestResult`, `RequestState`) as dataclasses whose
`to_json` gives exactly the shapes crfm-helm reads back from `scenario_state.json`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from flexlamps.evals.instances import Instance


@dataclass
class Request:
    model_deployment: str
    model: str
    prompt: str
    temperature: float = 0.0
    num_completions: int = 1
    top_k_per_token: int = 1
    max_tokens: int = 100
    stop_sequences: list[str] = field(default_factory=list)
    echo_prompt: bool = False
    embedding: bool = False
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    random: Optional[str] = None


@dataclass
class Token:
    text: str
    logprob: float


@dataclass
class Completion:
    text: str
    logprob: float
    tokens: list[Token]  # HELM fails on a completion without `tokens`
    finish_reason: Optional[dict] = None


@dataclass
class RequestResult:
    success: bool
    completions: list[Completion]
    embedding: list[float] = field(default_factory=list)  # HELM fails on a result without it
    cached: bool = False
    request_time: Optional[float] = None
    request_datetime: Optional[int] = None
    error: Optional[str] = None
    batch_size: Optional[int] = None
    batch_request_time: Optional[float] = None
    # flexlamps extras (HELM ignores unknown keys): what the engine reported for this request.
    num_prompt_tokens: Optional[int] = None
    is_greedy: Optional[bool] = None
    # this request's share of its engine batch's prefill tokens (requested, computed): summed over a
    # run's results they give its totals, however many invocations it took
    prefill_requested_share: Optional[float] = None
    prefill_computed_share: Optional[float] = None

    @classmethod
    def from_json(cls, d: dict) -> "RequestResult":
        comps = [Completion(c["text"], c["logprob"], [Token(**t) for t in c["tokens"]], c.get("finish_reason"))
                 for c in d.get("completions", [])]
        rest = {k: v for k, v in d.items() if k != "completions" and k in cls.__dataclass_fields__}
        return cls(completions=comps, **rest)


@dataclass
class RequestState:
    instance: Instance
    reference_index: Optional[int]
    request_mode: Optional[str]
    train_trial_index: int
    output_mapping: Optional[dict[str, str]]
    request: Request
    result: Optional[RequestResult]
    num_train_instances: int
    prompt_truncated: bool
    num_conditioning_tokens: int = 0
    # How the engine is asked, kept out of HELM's JSON: scored requests send (context,
    # continuation); `shared_prefix` is the part of the prompt every instance of the run shares.
    context: str = ""
    continuation: str = ""
    shared_prefix: str = ""

    @property
    def is_scored(self) -> bool:
        return bool(self.continuation)

    def to_json(self) -> dict:
        out = {
            "instance": self.instance.to_json(),
            "train_trial_index": self.train_trial_index,
            "request": asdict(self.request),
            "num_train_instances": self.num_train_instances,
            "prompt_truncated": self.prompt_truncated,
            "num_conditioning_tokens": self.num_conditioning_tokens,
        }
        if self.reference_index is not None:
            out["reference_index"] = self.reference_index
        if self.request_mode is not None:
            out["request_mode"] = self.request_mode
        if self.output_mapping is not None:
            out["output_mapping"] = self.output_mapping
        if self.result is not None:
            out["result"] = asdict(self.result)
        return out
