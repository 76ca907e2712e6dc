"""Resumable results never serve stale records nor overwrite another job's file; fingerprints."""

import json
import os

import pytest

from flexlamps.io.fingerprint import RecordFingerprint, file_sha256, model_digest, stable_hash
from flexlamps.io.results import ResultsError, ResumableResults
from offload import PathInUseError


def _fps(ids, model="m", options="o"):
    return {i: RecordFingerprint(model=model, options=options, prompt=stable_hash(i)) for i in ids}


def _finish(out, fps, overwrite=False):
    res = ResumableResults(out, fps, overwrite=overwrite)
    res.lock()
    try:
        state = res.load()
        kept, why = set(state.done), state.describe()
        res.open()
        for rid in fps:
            res.add({"id": rid, "text": f"text-{rid}"})
        res.finalize(list(fps))
    finally:
        res.release()
    return kept, why


def test_matching_records_are_kept_and_stale_ones_refused_then_recomputed(tmp_path):
    out = tmp_path / "out.jsonl"
    _finish(out, _fps(["a", "b"]))
    assert _finish(out, _fps(["a", "b"])) == ({"a", "b"}, None)
    changed = _fps(["a", "b"], model="other")
    with pytest.raises(ResultsError, match="2 made with another model file.*--overwrite"):
        _finish(out, changed)
    kept, why = _finish(out, changed, overwrite=True)
    assert not kept and why == "recomputing 2 finished records: 2 made with another model file"
    assert all(r["fingerprint"]["model"] == "other" for r in map(json.loads, out.read_text().splitlines()))


def test_partial_records_from_other_options_are_recomputed_and_counted(tmp_path):
    out = tmp_path / "out.jsonl"
    res = ResumableResults(out, _fps(["a", "b", "c"]))
    res.load()
    res.open()
    res.add({"id": "a", "text": "x"})
    res.add({"id": "b", "text": "y"})
    res.close()  # killed here
    res = ResumableResults(out, {**_fps(["a", "c"]), **_fps(["b"], options="new")})
    state = res.load()
    assert set(state.done) == {"a"} and state.describe() == "recomputing 1 finished records: 1 made with other options"


@pytest.mark.parametrize("body, needle", [
    ("just some notes\n", "line 1 is not a flexlamps record"),
    ('{"id": "zzz", "text": "t"}\n', "id 'zzz', which is not in the prompt file"),
    ("[1, 2]\n", "line 1 is not a flexlamps record"),
    ('{"text": "no id"}\n', "line 1 is not a flexlamps record"),
])
def test_out_file_of_another_job_is_refused_and_kept(tmp_path, body, needle):
    out = tmp_path / "out.jsonl"
    out.write_text(body)
    with pytest.raises(ResultsError, match=needle):
        ResumableResults(out, _fps(["a"])).load()
    assert out.read_text() == body


def test_damaged_partial_lines_are_named_and_only_they_recomputed(tmp_path):
    out = tmp_path / "out.jsonl"
    fps = _fps(["a", "b", "c"])
    res = ResumableResults(out, fps)
    res.load()
    res.open()
    for rid in "abc":
        res.add({"id": rid, "text": rid})
    res.close()
    lines = res.partial.read_text().splitlines()
    res.partial.write_text("\n".join([lines[0], '{"id": "b", "tex', "[3]", lines[2]]) + "\n" + '{"id": "torn')
    state = ResumableResults(out, fps).load()
    assert set(state.done) == {"a", "c"}
    assert "2 damaged (out.jsonl.partial line 2, out.jsonl.partial line 3)" in state.describe()


def test_second_writer_of_one_out_is_refused_naming_the_process(tmp_path):
    out = tmp_path / "out.jsonl"
    first = ResumableResults(out, _fps(["a"]))
    first.lock()
    with pytest.raises(PathInUseError, match=f"--out {out} is in use by process {os.getpid()}"):
        ResumableResults(out, _fps(["a"])).lock()
    first.release()
    ResumableResults(out, _fps(["a"])).lock()


def test_file_hash_is_cached_until_the_file_changes(tmp_path, monkeypatch):
    import flexlamps.io.fingerprint as fp

    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    cache = tmp_path / "hashes.json"
    first = file_sha256(model, cache)
    calls = []
    monkeypatch.setattr(fp, "_hash_file", lambda p: calls.append(p) or "fresh")
    assert file_sha256(model, cache) == first and not calls  # cached
    model.write_bytes(b"corrupt" * 1000)
    assert file_sha256(model, cache) == "fresh" and calls


def test_model_digest_of_a_folder_follows_its_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    before = model_digest(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    assert model_digest(tmp_path) != before


def test_a_changed_byte_in_a_partial_record_is_caught(tmp_path):
    out = tmp_path / "out.jsonl"
    fps = _fps(["a", "b"])
    res = ResumableResults(out, fps)
    res.load()
    res.open()
    res.add({"id": "a", "text": "hello"})
    res.add({"id": "b", "text": "world"})
    res.close()
    res.partial.write_text(res.partial.read_text().replace("hello", "jello"))
    state = ResumableResults(out, fps).load()
    assert set(state.done) == {"b"} and state.damaged == ["out.jsonl.partial line 1"]
    assert "_crc32" not in state.done["b"]
