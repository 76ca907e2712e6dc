"""Cost of JSON-schema masks per token in the grammar libraries flexlamps could use, on one
model's vocabulary: the schema's compile time, and the time to compute the allowed-token mask
and advance past one token, walking a valid answer token by token (--repeats walks; the first
one, cold, reported apart; medians, as a busy machine's preemptions land in a few tokens' times). Libraries not installed are skipped:

    .venv/bin/python -m pip install xgrammar outlines-core   # llguidance is flexlamps' own
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_grammar_libraries.py

docs/generate.md holds the figures that chose llguidance.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"type": "string"}},
    "sentiment": {"enum": ["positive", "negative", "neutral"]},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "tags", "sentiment", "address"], "additionalProperties": False}
ANSWER = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry", "engines"], "sentiment": "positive",
          "address": {"city": "London", "zip": "W1 2AB"}}


def _walk_llguidance(tokenizer, vocab: int, ids: list[int], repeats: int):
    import llguidance
    import numpy as np

    t0 = time.perf_counter()
    ll_tok = llguidance.LLTokenizer(tokenizer.tk.to_str(), n_vocab=vocab, eos_token=list(tokenizer.eos_token_ids))
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(ll_tok, grammar)
    compile_s = time.perf_counter() - t0
    words = np.empty((vocab + 31) // 32, dtype=np.int32)

    def walk():
        m = llguidance.LLMatcher(ll_tok, grammar)

        def step(t):
            m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
            assert m.consume_token(t), m.get_error()
        return step

    del matcher
    return setup, compile_s, [_timed_walk(walk, ids) for _ in range(repeats)]


def _walk_xgrammar(tokenizer, vocab: int, ids: list[int], repeats: int):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.tk)
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=list(tokenizer.eos_token_ids))
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    compile_s = time.perf_counter() - t0
    mask = xgr.allocate_token_bitmask(1, vocab)

    def walk():
        m = xgr.GrammarMatcher(compiled)

        def step(t):
            m.fill_next_token_bitmask(mask)
            assert m.accept_token(t)
        return step

    return setup, compile_s, [_timed_walk(walk, ids) for _ in range(repeats)]


def _walk_outlines_core(tokenizer, vocab: int, ids: list[int], repeats: int):
    import outlines_core as oc
    import torch
    from outlines_core.json_schema import build_regex_from_schema

    eos = tokenizer.eos_token_ids[0]
    t0 = time.perf_counter()
    tokens: dict[str, list[int]] = {}
    for text, token_id in tokenizer.tk.get_vocab().items():
        if token_id != eos:
            tokens.setdefault(text, []).append(token_id)
    vocabulary = oc.Vocabulary(eos, tokens)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = oc.Index(build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    compile_s = time.perf_counter() - t0
    mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

    def walk():
        guide = oc.Guide(index)

        def step(t):
            guide.write_mask_into(mask.data_ptr(), mask.numel(), 4)
            guide.advance(t)
        return step

    return setup, compile_s, [_timed_walk(walk, ids[:-1]) for _ in range(repeats)]  # the end token: no transition


def _timed_walk(walk, ids: list[int]) -> list[float]:
    """Seconds of each token's mask and advance along one walk of the answer."""
    step, times = walk(), []
    for t in ids:
        t0 = time.perf_counter()
        step(t)
        times.append(time.perf_counter() - t0)
    return times


LIBRARIES = {"llguidance": _walk_llguidance, "xgrammar": _walk_xgrammar, "outlines_core": _walk_outlines_core}


def main() -> None:
    from flexlamps.models.loading.registry import open_checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    reader = open_checkpoint(args.model)
    tokenizer, vocab = reader.tokenizer, reader.config.vocab_size
    ids = tokenizer.encode(json.dumps(ANSWER, separators=(",", ":")), add_special_tokens=False)
    ids.append(tokenizer.eos_token_ids[0])
    print(f"{args.model}: vocabulary {vocab}, answer {len(ids)} tokens")
    for name, walk in LIBRARIES.items():
        if importlib.util.find_spec(name) is None:
            print(f"{name:>13}: not installed, skipped")
            continue
        setup, compile_s, walks = walk(tokenizer, vocab, ids, args.repeats)
        steady = [t for w in walks[1:] for t in w]
        print(f"{name:>13}: tokenizer set-up {setup:.2f} s | compile {compile_s * 1e3:.1f} ms | mask + advance per "
              f"token: cold walk mean {statistics.mean(walks[0]) * 1e6:.0f} us, later walks median "
              f"{statistics.median(steady) * 1e6:.0f} us, mean {statistics.mean(steady) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
