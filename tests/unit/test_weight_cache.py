"""The packed-weight cache: a GGUF repacked once, later loads read the cache; keyed by the file's
bytes; a damaged entry is rebuilt; and the 4-bit-in-place engine agrees with fp32 on the file."""

from pathlib import Path

import numpy as np
import pytest
import torch

from flexlamps.engine.executors.step import Step
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.models.loading import weight_cache
from flexlamps.models.loading.checkpoint import GGUFReader, read_all
from flexlamps.models.loading.weight_cache import load_weights
from quant.int4_weight import Int4Weight
from tests.gguf_models import finish_gguf, llama_gguf_writer

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 128, 2, 4, 2, 48


def write_tiny_gguf(path: Path, seed: int = 0, all_q8_0: bool = False) -> Path:
    """A 2-layer LLaMA GGUF: Q4_1 attention, Q4_0 MLP, f32 norms and embeddings; `all_q8_0`:
    every matrix Q8_0 instead, the head tied to the Q8_0 embedding table."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = llama_gguf_writer(path, hidden=HIDDEN, ffn=FFN, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS, vocab=VOCAB)

    def add(name, shape, qtype=None):
        data = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    q41, q40, q80 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0
    if all_q8_0:
        q41 = q40 = q80
    add("token_embd.weight", (VOCAB, HIDDEN), q80 if all_q8_0 else None)
    add("output_norm.weight", (HIDDEN,))
    if not all_q8_0:
        add("output.weight", (VOCAB, HIDDEN))
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (HIDDEN,))
        add(f"blk.{i}.ffn_norm.weight", (HIDDEN,))
        add(f"blk.{i}.attn_q.weight", (HIDDEN, HIDDEN), q41)
        add(f"blk.{i}.attn_k.weight", (KV_HEADS * head_dim, HIDDEN), q41)
        add(f"blk.{i}.attn_v.weight", (KV_HEADS * head_dim, HIDDEN), q41)
        add(f"blk.{i}.attn_output.weight", (HIDDEN, HIDDEN), q41)
        add(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN), q40)
        add(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN), q40)
        add(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN), q40)
    return finish_gguf(w, path)


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def _same(a, b) -> bool:
    if isinstance(a, Int4Weight):
        return (isinstance(b, Int4Weight) and torch.equal(a.plain_codes(), b.plain_codes())
                and torch.equal(a.scale_zero, b.scale_zero) and torch.equal(a.kernel_codes, b.kernel_codes))
    return torch.equal(a, b)


def test_second_load_reads_the_cache(tiny_gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    reader = GGUFReader(tiny_gguf)
    first = load_weights(reader, torch.bfloat16, int4_in_place=True, cache_dir=cache)
    assert isinstance(first["layers.0.q_proj"], Int4Weight) and isinstance(first["layers.1.down_proj"], Int4Weight)
    assert len(list(cache.glob("weights-*.safetensors"))) == 1

    def no_read(*a, **k):
        raise AssertionError("the second load must come from the cache")

    monkeypatch.setattr(weight_cache, "read_all", no_read)
    second = load_weights(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True, cache_dir=cache)
    assert first.keys() == second.keys() and all(_same(first[k], second[k]) for k in first)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="no /proc here")
def test_the_first_load_maps_the_entry_it_wrote(tiny_gguf, tmp_path):
    """The first load holds what a later one does: the entry it wrote, mapped (its heap copies let
    go: a llama-3.2-1b GGUF's first load kept 2.5 GB resident, later ones ~1.1), the same values."""
    from flexlamps.models.loading.mapped_pages import _tensors, file_mappings

    first = load_weights(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True, cache_dir=tmp_path / "cache")
    with open("/proc/self/maps") as f:
        mapped = file_mappings(f.read())
    tensors = [t for w in first.values() for t in _tensors(w) if t.numel()]
    assert tensors and all(any(lo <= t.data_ptr() < hi for lo, hi in mapped) for t in tensors)
    expect = read_all(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True)
    assert expect.keys() == first.keys() and all(_same(expect[k], first[k]) for k in expect)


def test_cache_is_keyed_by_the_file_and_the_packing(tiny_gguf, tmp_path):
    cache = tmp_path / "cache"
    load_weights(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True, cache_dir=cache)
    load_weights(GGUFReader(tiny_gguf), torch.float32, int4_in_place=False, cache_dir=cache)
    other = write_tiny_gguf(tmp_path / "other.gguf", seed=1)
    fresh = load_weights(GGUFReader(other), torch.bfloat16, int4_in_place=True, cache_dir=cache)
    assert len(list(cache.glob("weights-*.safetensors"))) == 3
    expect = read_all(GGUFReader(other), torch.bfloat16, int4_in_place=True)
    assert all(_same(expect[k], fresh[k]) for k in expect)


def test_damaged_cache_entry_is_rebuilt(tiny_gguf, tmp_path):
    cache = tmp_path / "cache"
    load_weights(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True, cache_dir=cache)
    (entry,) = cache.glob("weights-*.safetensors")
    entry.write_bytes(entry.read_bytes()[:100])
    again = load_weights(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True, cache_dir=cache)
    expect = read_all(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True)
    assert all(_same(expect[k], again[k]) for k in expect)
    assert entry.stat().st_size > 100


def test_int4_in_place_engine_agrees_with_fp32(tiny_gguf):
    reader = GGUFReader(tiny_gguf)
    assert reader.has_int4_weights
    ref = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    int4 = InMemoryExecutor(reader.config, read_all(reader, torch.bfloat16, int4_in_place=True), torch.bfloat16)
    assert {"qkv_proj", "gate_up_proj"} <= int4.layer_weights[0].keys()  # 4-bit projections stacked
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(12).expand(2, 12)
    outs = []
    for ex in (ref, int4):
        cache = ex.new_cache(2, 16)
        prefill = ex.forward_steps(cache, [Step(ids, pos, torch.arange(2))])[0]  # 24 rows: the fused kernel
        step = ex.forward_steps(cache, [Step(ids[:, -1:], pos[:, -1:] + 1, torch.arange(2))])[0]
        outs.append((prefill, step))
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())


def test_header_is_parsed_once_and_reparsed_when_the_file_changes(tiny_gguf, tmp_path, monkeypatch):
    import gguf

    cache = tmp_path / "cache"
    first = GGUFReader(tiny_gguf, cache)
    real = gguf.GGUFReader

    def no_parse(*a, **k):
        raise AssertionError("a cached header must not be parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", no_parse)
    second = GGUFReader(tiny_gguf, cache)
    assert second.fields == first.fields and second.config == first.config and second.sha256 == first.sha256
    monkeypatch.setattr(gguf, "GGUFReader", real)
    write_tiny_gguf(tiny_gguf, seed=2)  # same size, new bytes and mtime
    assert GGUFReader(tiny_gguf, cache).sha256 != first.sha256


def test_cache_keeps_the_recently_used_entries_within_its_size(tmp_path, monkeypatch):
    import os

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.txt").write_text("the user's file")  # never one of the cache's own entries
    for age, name in enumerate(("old", "used", "mid")):  # written in this order, 100 bytes each
        entry = cache / f"weights-{name}.safetensors"
        entry.write_bytes(b"x" * 100)
        os.utime(entry, ns=(10**18 + age * 10**9, 10**18 + age * 10**9))
    weight_cache._mark_used(cache / "weights-used.safetensors")  # read by a load: the newest use
    new = cache / "weights-new.safetensors"
    new.write_bytes(b"x" * 100)
    deleted = weight_cache.prune(cache, keep=new, max_bytes=250)
    assert sorted(p.name for p in deleted) == ["weights-mid.safetensors", "weights-old.safetensors"]
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt", "weights-new.safetensors",
                                                       "weights-used.safetensors"]
    assert weight_cache.prune(cache, keep=new, max_bytes=50) == [cache / "weights-used.safetensors"]
    assert new.exists()  # the entry just written stays even when it alone is over the size


def test_a_load_prunes_the_folder_and_keeps_its_entry(tiny_gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = cache / "weights-stale.safetensors"
    stale.write_bytes(b"x" * 1000)
    monkeypatch.setattr(weight_cache, "MAX_CACHE_BYTES", 1)
    load_weights(GGUFReader(tiny_gguf), torch.bfloat16, int4_in_place=True, cache_dir=cache)
    assert not stale.exists() and len(list(cache.glob("weights-*.safetensors"))) == 1


def _twin_logits(reader, cache_file=None):
    """Prefill logits of 24 rows (the twins' dense copies) from an executor with dense twins."""
    import functools

    from flexlamps.models.loading.weight_cache import dense_copies

    copies = functools.partial(dense_copies, cache_file) if cache_file else None
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.bfloat16, int4_in_place=True), torch.bfloat16,
                          dense_twins=True, dense_copies=copies)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    return ex.forward_steps(ex.new_cache(2, 16), [Step(ids, torch.arange(12).expand(2, 12), torch.arange(2))])[0]


def test_dense_twins_are_read_from_the_cache_and_equal_dequantizing(tiny_gguf, tmp_path, monkeypatch):
    from flexlamps.engine.executors import in_memory
    from flexlamps.models.loading.weight_cache import dense_path, entry_path

    monkeypatch.setattr(in_memory, "codes_serve_both_phases", lambda w: False)  # twins where our kernels take all

    reader = GGUFReader(tiny_gguf)
    want = _twin_logits(reader)  # every twin dequantizes its own copy
    path = dense_path(entry_path(reader, torch.bfloat16, True, tmp_path / "cache"))
    assert torch.equal(_twin_logits(reader, path), want) and path.exists()  # written, then read back
    with monkeypatch.context() as m:
        m.setattr(Int4Weight, "dequantize", lambda *a, **k: pytest.fail("a warm load must read the dense copies"))
        assert torch.equal(_twin_logits(reader, path), want)
    path.write_bytes(path.read_bytes()[:100])  # torn: rebuilt
    assert torch.equal(_twin_logits(reader, path), want) and path.stat().st_size > 100
    monkeypatch.setattr(weight_cache, "_holds_dense", lambda *a: True)
    path.unlink()  # gone after the load checked it (pruned by another process): each twin dequantizes
    assert torch.equal(_twin_logits(reader, path), want)
