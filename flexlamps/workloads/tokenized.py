"""Real tokens for augmented requests: a trace gives token counts; the engine needs ids.

A `TokenizedRequest` pairs a scheduler `RequestSpec` with its prompt ids and, for each API
call, the ids the call returns. Ids are deterministic filler (seeded by the request's
template, so the same template always gives the same text) drawn from the model's ordinary
vocabulary, never a special token. `scale_spec` shrinks a trace request so a CPU can run it:
caps on prompt / per-segment output / returned lengths and the context, and API durations
multiplied by a time scale.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from dataclasses import dataclass

from flexlamps.sched.request import RequestSpec, Segment
from flexlamps.workloads.trace import Template, load_templates, replay


@dataclass(frozen=True, kw_only=True)
class TraceScale:
    """How a trace is shrunk to run on a CPU (every cap in tokens; None = no cap)."""

    time_scale: float = 1.0  # API durations are multiplied by this (wall seconds per trace second)
    max_prompt: int | None = None  # prompt tokens
    max_segment_output: int | None = None  # tokens decoded per segment
    max_api_tokens: int | None = None  # tokens an API call returns
    max_context: int = 2048  # the whole request (prompt + outputs + returned) stays below this

    def __post_init__(self):
        if self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {self.time_scale}")
        for name in ("max_prompt", "max_segment_output", "max_api_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 (or None for no cap), got {v}")
        if self.max_context < 4:
            raise ValueError(f"max_context must be >= 4 tokens, got {self.max_context}")


def _cap(value: int, limit: int | None) -> int:
    return value if limit is None else min(value, limit)


def scale_spec(spec: RequestSpec, scale: TraceScale) -> RequestSpec:
    """Apply the caps and the time scale; cut the request where its context would reach
    `max_context` (the segment that would cross it becomes the last, with no call)."""
    prompt = max(1, min(_cap(spec.prompt_tokens, scale.max_prompt), scale.max_context // 2))
    ctx, segs = prompt, []
    for seg in spec.segments:
        out = max(1, _cap(seg.completion_tokens, scale.max_segment_output))
        room = scale.max_context - ctx - 1  # the last sampled token is never fed back
        if out >= room:
            segs.append(Segment(max(1, room)))
            break
        ret = _cap(seg.api_tokens, scale.max_api_tokens) if seg.api_type else 0
        if not seg.api_type or ctx + out + ret >= scale.max_context - 1:
            segs.append(Segment(out))
            break
        segs.append(Segment(out, seg.api_type, seg.api_time * scale.time_scale, ret))
        ctx += out + ret
    return dataclasses.replace(spec, prompt_tokens=prompt, segments=tuple(segs))


def total_tokens(spec: RequestSpec) -> int:
    """Context length when the request ends (its last sampled token is not fed back)."""
    return spec.prompt_tokens + sum(s.completion_tokens + s.api_tokens for s in spec.segments)


@dataclass(frozen=True)
class TokenizedRequest:
    spec: RequestSpec
    prompt_ids: tuple[int, ...]
    returned_ids: tuple[tuple[int, ...], ...]  # per segment; empty for the last (no call)

    def __post_init__(self):
        if len(self.prompt_ids) != self.spec.prompt_tokens:
            raise ValueError(f"{self.spec.request_id}: {len(self.prompt_ids)} prompt ids for "
                             f"{self.spec.prompt_tokens} prompt tokens")
        if len(self.returned_ids) != len(self.spec.segments) or any(
                len(r) != s.api_tokens for r, s in zip(self.returned_ids, self.spec.segments)):
            raise ValueError(f"{self.spec.request_id}: returned ids do not match the segments' api_tokens")


def filler_ids(key: str, n: int, vocab_size: int, avoid: set[int]) -> tuple[int, ...]:
    """`n` deterministic token ids keyed by `key`, from [0, vocab_size) minus `avoid`."""
    rng = random.Random(zlib.crc32(key.encode()))
    out = []
    while len(out) < n:
        tok = rng.randrange(vocab_size)
        if tok not in avoid:
            out.append(tok)
    return tuple(out)


def template_of(request_id: str) -> str:
    """Replayed ids look like `r{i}-{template}`; requests of one template share their text."""
    head, _, tail = request_id.partition("-")
    return tail if head.startswith("r") and tail else request_id


def tokenize_requests(specs: list[RequestSpec], vocab_size: int, special_ids: set[int]) -> list[TokenizedRequest]:
    out = []
    for spec in specs:
        key = template_of(spec.request_id)
        returned = tuple(filler_ids(f"{key}/api{i}", s.api_tokens, vocab_size, special_ids)
                         for i, s in enumerate(spec.segments))
        out.append(TokenizedRequest(spec, filler_ids(f"{key}/prompt", spec.prompt_tokens, vocab_size,
                                                     special_ids), returned))
    return out


def load_trace(tokenizer, trace_path: str) -> list[Template]:
    """Trace templates, text segments counted with the model's tokenizer (not capped: the
    TraceScale caps them)."""
    return load_templates(trace_path, lambda text: len(tokenizer.encode(text)), max_model_len=1 << 30)


def replay_requests(cfg, templates: list[Template], scale: TraceScale, qps: float, num_requests: int,
                    seed: int = 0) -> list[TokenizedRequest]:
    """`num_requests` drawn from `templates` with Poisson arrivals at `qps`, scaled, with ids; the
    filler ids avoid the special tokens of `cfg` (the model's ModelConfig)."""
    special = set(cfg.eos_token_ids) | ({cfg.bos_token_id} if cfg.bos_token_id is not None else set())
    specs = [scale_spec(s, scale) for s in replay(templates, qps, seed=seed, num_requests=num_requests)]
    return tokenize_requests(specs, cfg.vocab_size, special)
