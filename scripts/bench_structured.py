"""Schema-constrained decoding against the same batch unconstrained, on one engine, alternating
(unconstrained first in odd rounds, constrained first in even ones, so a drifting machine load
favours neither), best of --repeats. Prints tokens/s of each and their ratio, and the median
decode step of each (the time between two steps' tokens: what the grammar masks add to a step).

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_structured.py --prompts 64 --max-new-tokens 24 --repeats 3

Two comparisons over the same --prompts chat prompts (one batch of them):
- "equal work": every row generates exactly --max-new-tokens tokens in both runs (unconstrained:
  EOS ignored; constrained: a schema whose value cannot close that soon: a long array of person
  records), so the ratio is the cost of the grammar masks alone;
- "realistic" (with --realistic): an extraction schema (nested object, enum, array, required
  fields), rows ending when their JSON closes (or at twice --max-new-tokens), against the
  unconstrained rows ending at EOS or that limit; tokens/s of what each generated (the batch thins
  out differently, so this ratio also moves with the lengths).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from flexlamps import LLM, SamplingParams
from flexlamps.io.records import canonical_schema

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "sentiment": {"enum": ["positive", "negative", "neutral"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                "required": ["city", "country"], "additionalProperties": False}},
    "required": ["name", "age", "sentiment", "tags", "address"], "additionalProperties": False}
LONG = {"type": "array", "items": PERSON, "minItems": 50}


def _mask_ms_per_step(llm: LLM, rows: int) -> float:
    """Milliseconds the grammar masks add to one decode step of `rows` constrained rows: every
    row's mask computed and applied to (rows, vocab) logits, walking a valid answer token by token."""
    import torch

    from flexlamps.engine.batch.grammar import mask_rows

    answer = {"name": "Ada Lovelace", "age": 36, "sentiment": "positive", "tags": ["math", "poetry"],
              "address": {"city": "London", "country": "UK"}}
    ids = llm.tokenizer.encode(json.dumps(answer, separators=(",", ":")), add_special_tokens=False)
    grammars = [llm.grammars.matcher(canonical_schema(PERSON)) for _ in range(rows)]
    logits = torch.zeros(rows, llm.config.vocab_size)
    t0 = time.perf_counter()
    for token in ids:
        mask_rows(logits, list(range(rows)), grammars)
        for g in grammars:
            g.advance(token)
    return (time.perf_counter() - t0) / len(ids) * 1e3


def _timed(llm: LLM, ids: list[list[int]], params: SamplingParams) -> tuple[float, int, float]:
    """(wall seconds, tokens generated, median seconds between two decode steps' tokens)."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    outs = llm.generate_ids(ids, [params] * len(ids), on_tokens=lambda n: stamps.append(time.perf_counter()))
    wall = time.perf_counter() - t0
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:])]  # after the prefill's step
    return wall, sum(len(o.token_ids) for o in outs), statistics.median(steps) if steps else float("nan")


def _compare(llm, ids, free: SamplingParams, bound: SamplingParams, repeats: int) -> dict:
    best = {"free": 0.0, "bound": 0.0}
    step = {"free": float("inf"), "bound": float("inf")}
    for round_idx in range(repeats):
        order = (("free", free), ("bound", bound))
        for name, params in order if round_idx % 2 == 0 else order[::-1]:
            wall, tokens, step_s = _timed(llm, ids, params)
            best[name] = max(best[name], tokens / wall)
            step[name] = min(step[name], step_s)
            print(f"  {'constrained' if name == 'bound' else 'unconstrained'}: {tokens} tokens in {wall:.1f} s "
                  f"({tokens / wall:.2f} tok/s), median decode step {step_s * 1e3:.0f} ms", flush=True)
    return {**best, "ratio": best["bound"] / best["free"], "step_ms_free": step["free"] * 1e3,
            "step_ms_bound": step["bound"] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--realistic", action="store_true", help="also the extraction-schema comparison")
    args = ap.parse_args()
    llm = LLM(args.model, max_batch_size=args.prompts)
    ids = [llm.encode_chat([{"role": "user", "content": f"Describe person number {i} as JSON: name, age, "
                                                        "sentiment, tags and address."}]) for i in range(args.prompts)]
    llm.grammars.compile(canonical_schema(PERSON))  # the tokenizer's trie: built once per run, not timed
    print(f"masks of {args.prompts} rows: {_mask_ms_per_step(llm, args.prompts):.1f} ms a decode step", flush=True)
    n = args.max_new_tokens
    results = {"equal work": _compare(llm, ids, SamplingParams(max_new_tokens=n, ignore_eos=True),
                                      SamplingParams(max_new_tokens=n, json_schema=canonical_schema(LONG)), args.repeats)}
    if args.realistic:
        results["realistic"] = _compare(llm, ids, SamplingParams(max_new_tokens=n * 2),
                                        SamplingParams(max_new_tokens=n * 2, json_schema=canonical_schema(PERSON)),
                                        args.repeats)
    print(json.dumps({"prompts": args.prompts, "max_new_tokens": n, **results}))
    for name, r in results.items():
        print(f"{name:>10}: unconstrained {r['free']:.2f} tok/s | constrained {r['bound']:.2f} tok/s | ratio "
              f"{r['ratio']:.3f} (bar >= 0.85) | decode step {r['step_ms_free']:.0f} vs {r['step_ms_bound']:.0f} ms "
              f"({r['step_ms_bound'] / r['step_ms_free'] - 1:+.1%})")


if __name__ == "__main__":
    main()
