"""Distinct benchmark prompts of an exact token length, from real text.

Every prompt starts at its own WikiText-2 paragraph and runs on through the following ones until it
holds `length` tokens; the next prompt starts at the first paragraph after that, so no two prompts
share text and a prefix cache finds nothing to reuse between them. Without the shared data folder
(a fresh machine) the text comes from a seeded sentence generator instead: still deterministic,
still distinct. Used by bench_generate.py and bench_offload.py.

    python scripts/bench_prompts.py [--n 128] [--length 64]   # distinctness of what the benches get
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
WIKITEXT = Path("wikitext2") / "wikitext-test.txt"

# The fallback's words: enough of them that seeded sentences do not repeat.
_WORDS = ("river city engine market winter history garden letter council harbor station theory "
          "village signal bridge painter century doctor island record machine teacher forest "
          "battle museum railway church farmer system pattern voice northern ancient quiet "
          "open early broken simple narrow golden public several little modern").split()
_VERBS = "built carried opened found moved wrote changed measured crossed followed reached named".split()


def shared_data() -> Path:
    """Where the shared evaluation data lives: $FLEXLAMPS_SHARED_DATA, else ../shared/data."""
    return Path(os.environ.get("FLEXLAMPS_SHARED_DATA") or REPO.parent / "shared" / "data")


def wikitext_paragraphs(path: Path) -> Iterator[str]:
    """WikiText-2's body paragraphs in file order (headings such as ' = Title = ' and blanks skipped)."""
    for line in path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n"):
        line = line.strip()
        if line and not line.startswith("="):
            yield line


def generated_paragraphs(seed: int = 0) -> Iterator[str]:
    """An endless deterministic stream of distinct made-up paragraphs (numbered, so none repeats)."""
    rng = random.Random(seed)
    for k in range(10**9):
        words = [f"Record {k}:"]
        for _ in range(rng.randint(3, 6)):
            words += [rng.choice(_WORDS).capitalize(), rng.choice(_WORDS), rng.choice(_VERBS),
                      "the", rng.choice(_WORDS), rng.choice(_WORDS) + "."]
        yield " ".join(words)


def _paragraphs() -> Iterator[str]:
    path = shared_data() / WIKITEXT
    if path.is_file():
        yield from wikitext_paragraphs(path)
    yield from generated_paragraphs()  # after WikiText runs out, or instead of it


def distinct_prompts(tokenizer, n: int, length: int, vocab: int | None = None) -> list[list[int]]:
    """`n` distinct prompts of exactly `length` token ids (taken modulo `vocab` when given, for a model
    whose vocabulary is smaller than the tokenizer's); no special tokens are added."""
    if n < 0 or length < 1:
        raise ValueError(f"need n >= 0 prompts of length >= 1, got n={n}, length={length}")
    prompts: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    current: list[int] = []
    for paragraph in _paragraphs():
        if len(prompts) == n:
            break
        ids = tokenizer.encode(("\n" if current else "") + paragraph, add_special_tokens=False)
        current += [t % vocab for t in ids] if vocab else ids
        if len(current) >= length:
            prompt, current = tuple(current[:length]), []
            if prompt not in seen:
                seen.add(prompt)
                prompts.append(list(prompt))
    return prompts


def longest_shared_prefix(prompts: list[list[int]]) -> int:
    """The most leading tokens any two prompts have in common (what a prefix cache could reuse)."""
    ordered = sorted(map(tuple, prompts))
    best = 0
    for a, b in zip(ordered, ordered[1:]):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        best = max(best, k)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer (a built-in name or a path)")
    args = ap.parse_args()
    from flexlamps.models.loading.registry import open_checkpoint

    prompts = distinct_prompts(open_checkpoint(args.model).tokenizer, args.n, args.length)
    source = "WikiText-2" if (shared_data() / WIKITEXT).is_file() else "generated text (no shared data)"
    print(f"{len(prompts)} prompts x {args.length} tokens from {source}: "
          f"{len(set(map(tuple, prompts)))} distinct, longest shared prefix {longest_shared_prefix(prompts)} tokens")


if __name__ == "__main__":
    main()
