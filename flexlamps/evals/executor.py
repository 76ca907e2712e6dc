"""Sends a run's requests to the engine in batches and records HELM `RequestResult`s.

Requests go in the order the adapter made them, so those sharing a prompt prefix (instructions and
examples; a question's choices) arrive together and the engine computes that prefix once. Every
finished batch is appended to a progress log, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from flexlamps import fault_points
from flexlamps.evals.requests import Completion, RequestResult, RequestState, Token


def request_key(state: RequestState, engine_key: str = "") -> str:
    """Identifies a request's content and the engine that answers it (weights, dtype,
    compression), so a resumed run never reuses a result computed from other inputs."""
    r = state.request
    blob = json.dumps([r.prompt, state.context, state.continuation, r.max_tokens, r.temperature,
                       r.stop_sequences, r.model, engine_key], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


class ProgressLog:
    """Append-only JSONL of finished results: {"i": index, "key": ..., "result": {...}}."""

    def __init__(self, path: Optional[Path], engine_key: str = ""):
        self.path = Path(path) if path else None
        self.engine_key = engine_key

    def load(self, states: list[RequestState]) -> int:
        """Fill `result` of states already done; returns how many. A torn last line is ignored."""
        if self.path is None or not self.path.exists():
            return 0
        done = 0
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                i = rec.get("i")
                if isinstance(i, int) and 0 <= i < len(states) and rec.get("key") == request_key(states[i], self.engine_key):
                    if states[i].result is None:
                        done += 1
                    states[i].result = RequestResult.from_json(rec["result"])
        return done

    def append(self, items: list[tuple[int, RequestState]]) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            for i, st in items:
                f.write(json.dumps({"i": i, "key": request_key(st, self.engine_key), "result": asdict(st.result)},
                                   ensure_ascii=False) + "\n")
            f.flush()
        fault_points.reached("helm_progress")


def _prefill_counters(llm) -> tuple[Optional[int], Optional[int]]:
    st = getattr(llm, "stats", None)
    return (getattr(st, "prefill_tokens_requested", None), getattr(st, "prefill_tokens_computed", None))


def _token_texts(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([t]) for t in ids]


class Executor:
    """Runs request states on an `LLM` (flexlamps' API or anything with the same methods)."""

    def __init__(self, llm, make_sampling_params: Callable, batch_size: int = 32):
        self.llm = llm
        self.make_params = make_sampling_params
        self.batch_size = max(1, batch_size)

    def run(self, states: list[RequestState], log: ProgressLog,
            on_progress: Optional[Callable[[int], None]] = None) -> None:
        pending = [i for i, s in enumerate(states) if s.result is None]
        for start in range(0, len(pending), self.batch_size):
            idx = pending[start: start + self.batch_size]
            batch = [states[i] for i in idx]
            scored = [s for s in batch if s.is_scored]
            generated = [s for s in batch if not s.is_scored]
            requested0, computed0 = _prefill_counters(self.llm)
            t0 = time.perf_counter()
            if scored:
                self._score(scored)
            if generated:
                self._generate(generated)
            elapsed = time.perf_counter() - t0
            requested1, computed1 = _prefill_counters(self.llm)
            now = int(time.time())
            for s in batch:
                s.result.request_time = elapsed / len(batch)
                s.result.batch_request_time = elapsed
                s.result.batch_size = len(batch)
                s.result.request_datetime = now
                if None not in (requested0, computed0, requested1, computed1):
                    s.result.prefill_requested_share = (requested1 - requested0) / len(batch)
                    s.result.prefill_computed_share = (computed1 - computed0) / len(batch)
            log.append(list(zip(idx, batch)))
            if on_progress:
                on_progress(len(batch))

    def _generate(self, states: list[RequestState]) -> None:
        # All generation requests of a run share one adapter spec, hence one set of parameters.
        req = states[0].request
        params = self.make_params(max_new_tokens=req.max_tokens, temperature=req.temperature,
                                  stop=tuple(req.stop_sequences), logprobs=True, seed=0)
        outs = self.llm.generate([s.request.prompt for s in states], params)
        tok = self.llm.tokenizer
        for s, o in zip(states, outs):
            lps = list(o.logprobs) if o.logprobs is not None else [0.0] * len(o.token_ids)
            texts = _token_texts(tok, list(o.token_ids))
            tokens = [Token(t, float(lp)) for t, lp in zip(texts, lps)]
            s.result = RequestResult(
                success=True,
                completions=[Completion(o.text, float(sum(lps)), tokens, {"reason": o.finish_reason})],
                num_prompt_tokens=o.num_prompt_tokens,
            )

    def _score(self, states: list[RequestState]) -> None:
        tok = self.llm.tokenizer
        # A document scored from its start needs something to condition on: the tokenizer's BOS
        # when it has one (the engine adds it for an empty context), else a newline.
        bare = "" if getattr(tok, "bos_token_id", 0) is not None else "\n"
        for s in states:
            if not s.context:
                s.context = bare
        outs = self.llm.score([s.context for s in states], [s.continuation for s in states])
        for s, o in zip(states, outs):
            # The continuation's tokens as the engine saw them: the tail of the joint encoding.
            full = tok.encode(s.context + s.continuation)
            lps = list(o.token_logprobs) if o.token_logprobs is not None else []
            n = o.num_tokens
            texts = _token_texts(tok, full[-n:]) if n and len(full) >= n else [s.continuation]
            if len(lps) != len(texts):
                lps = [float(o.logprob)] + [0.0] * (len(texts) - 1)
            tokens = [Token(t, float(lp)) for t, lp in zip(texts, lps)]
            s.result = RequestResult(
                success=True,
                completions=[Completion(s.continuation, float(o.logprob), tokens)],
                num_prompt_tokens=len(full),
                is_greedy=bool(o.is_greedy) if o.is_greedy is not None else None,
            )
            s.num_conditioning_tokens = len(full) - n
