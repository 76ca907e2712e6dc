"""scripts/bench_prompts.py: the benchmarks' prompts are distinct, exactly as long as asked, the same
on every run, and still made on a machine without the shared data folder."""

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

_spec = importlib.util.spec_from_file_location(
    "bench_prompts", Path(__file__).resolve().parents[2] / "scripts" / "bench_prompts.py")
bench_prompts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_prompts)


class CharTokenizer:
    """One id per character: enough to check lengths, distinctness and where text comes from."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


@pytest.mark.parametrize("data", ["missing", "shared"])
@pytest.mark.parametrize("n,length", [(1, 1), (32, 128), (300, 64)])
def test_prompts_are_distinct_exact_and_deterministic(monkeypatch, tmp_path, data, n, length):
    if data == "shared" and not (SHARED_DATA / bench_prompts.WIKITEXT).is_file():
        pytest.skip("no shared data")
    monkeypatch.setenv("FLEXLAMPS_SHARED_DATA", str(SHARED_DATA if data == "shared" else tmp_path))
    prompts = bench_prompts.distinct_prompts(CharTokenizer(), n, length)
    assert len(prompts) == n and all(len(p) == length for p in prompts)
    assert len({tuple(p) for p in prompts}) == n
    assert prompts == bench_prompts.distinct_prompts(CharTokenizer(), n, length)


def test_prompts_start_at_their_own_paragraph(monkeypatch, tmp_path):
    text = "\r\n".join([" = Title = ", "", "first one here", "", "second", "third paragraph", " = = Sub = = "])
    (tmp_path / "wikitext2").mkdir()
    (tmp_path / bench_prompts.WIKITEXT).write_text(text, encoding="utf-8")
    monkeypatch.setenv("FLEXLAMPS_SHARED_DATA", str(tmp_path))
    got = [CharTokenizer().decode(p) for p in bench_prompts.distinct_prompts(CharTokenizer(), 3, 10)]
    # the short "second" runs on into "third paragraph"; then the made-up text takes over
    assert got[:2] == ["first one ", "second\nthi"]
    assert got[2].startswith("Record 0:")


def test_vocab_wraps_ids_and_shared_prefix_is_measured():
    prompts = bench_prompts.distinct_prompts(CharTokenizer(), 8, 16, vocab=50)
    assert max(max(p) for p in prompts) < 50
    assert bench_prompts.longest_shared_prefix([[1, 2, 3], [1, 2, 4], [5]]) == 2
    with pytest.raises(ValueError, match="length"):
        bench_prompts.distinct_prompts(CharTokenizer(), 2, 0)
