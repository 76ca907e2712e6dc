"""Schema-constrained decoding against the same batch unconstrained, on one engine, alternating,
best of --repeats. Prints tokens/s of each and their ratio.

    OMP_NUM_THREADS=2 .venv/bin/python scripts/bench_structured.py --prompts 64 --max-new-tokens 24

Two comparisons over the same --prompts chat prompts (one batch of them):
- "equal work": every row generates exactly --max-new-tokens tokens in both runs (unconstrained:
  EOS ignored; constrained: a schema whose value cannot close that soon: a long array of person
  records), so the ratio is the cost of the grammar masks alone;
- "realistic": an extraction schema (nested object, enum, array, required fields), rows ending
  when their JSON closes (or at twice --max-new-tokens), against the unconstrained rows ending at
  EOS or that limit; tokens/s of what each generated (the batch thins out differently, so this
  ratio also moves with the lengths).
"""

from __future__ import annotations

import argparse
import json
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


def _timed(llm: LLM, ids: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate_ids(ids, [params] * len(ids))
    return time.perf_counter() - t0, sum(len(o.token_ids) for o in outs)


def _compare(llm, ids, free: SamplingParams, bound: SamplingParams, repeats: int) -> dict:
    best = {"free": 0.0, "bound": 0.0}
    for _ in range(repeats):
        for name, params in (("free", free), ("bound", bound)):
            wall, tokens = _timed(llm, ids, params)
            best[name] = max(best[name], tokens / wall)
            print(f"  {'constrained' if name == 'bound' else 'unconstrained'}: {tokens} tokens in {wall:.1f} s", flush=True)
    return {**best, "ratio": best["bound"] / best["free"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    llm = LLM(args.model, max_batch_size=args.prompts)
    ids = [llm.encode_chat([{"role": "user", "content": f"Describe person number {i} as JSON: name, age, "
                                                        "sentiment, tags and address."}]) for i in range(args.prompts)]
    llm.grammars.compile(canonical_schema(PERSON))  # the tokenizer's trie: built once per run, not timed
    print(f"masks of {args.prompts} rows: {_mask_ms_per_step(llm, args.prompts):.1f} ms a decode step", flush=True)
    n = args.max_new_tokens
    equal = _compare(llm, ids, SamplingParams(max_new_tokens=n, ignore_eos=True),
                     SamplingParams(max_new_tokens=n, json_schema=canonical_schema(LONG)), args.repeats)
    real = _compare(llm, ids, SamplingParams(max_new_tokens=n * 2),
                    SamplingParams(max_new_tokens=n * 2, json_schema=canonical_schema(PERSON)), args.repeats)
    print(json.dumps({"prompts": args.prompts, "max_new_tokens": n, "equal_work": equal, "realistic": real}))
    for name, r in (("equal work", equal), ("realistic", real)):
        print(f"{name:>10}: unconstrained {r['free']:.1f} tok/s | constrained {r['bound']:.1f} tok/s | "
              f"ratio {r['ratio']:.3f}")


if __name__ == "__main__":
    main()
