"""A GGUF matrix's kept form is built a few tile rows at a time (`in_place.blocks_matrix`) and a
table's piece from its own rows of the file: the same parts, the same bits, as the matrix built
whole from all its blocks at once (and, for a piece, that whole's `rows`), in every block type the
engine keeps, for row counts that fill the kernel's tiles and ones that do not; and the build's
transients stay a few rows' worth where building a 1B's tied head whole held ~1.3 GB."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flexlamps.models.loading import in_place
from flexlamps.models.loading.gguf_codes import INT4_BLOCK_TYPES, INT8_BLOCK_TYPES
from flexlamps.models.loading.gguf_tensors import unpermute_rows
from flexlamps.models.weight_specs import WeightSpec
from placement.cost_memory import BUILD_BYTES_PER_WEIGHT, BUILD_WEIGHTS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
random_gguf = importlib.import_module("random_gguf")


def blocks(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A (rows, cols) matrix's raw bytes in `type_name` (the tests' writer: K-quants as random blocks)."""
    return random_gguf._stored(np.random.default_rng(seed), "m", (rows, cols), type_name, random_gguf.SMALL_NORMAL)


def whole(raw: np.ndarray, type_name: str, shape, dtype=torch.bfloat16):
    """The form built from all of the matrix's blocks at once (as before the build went by rows)."""
    if type_name in INT4_BLOCK_TYPES:
        return in_place.int4_matrix(raw, type_name, shape, dtype).kernel_only()
    return in_place.int8_matrix(raw, type_name, shape, dtype)


def by_rows(raw: np.ndarray, type_name: str, shape, piece=None, dtype=torch.bfloat16):
    w = in_place.blocks_matrix(lambda start, stop: raw[start:stop], type_name, shape, dtype, piece=piece)
    return w.kernel_only() if type_name in INT4_BLOCK_TYPES else w


def assert_same(got, want) -> None:
    assert type(got) is type(want)
    got_parts, want_parts = got.to_tensors(with_kernel=True), want.to_tensors(with_kernel=True)
    assert got_parts.keys() == want_parts.keys()
    for name, t in want_parts.items():
        bits = lambda x: x.contiguous().view(torch.uint8)  # noqa: E731 (Q6_K's scales: fp16 and int8 bits as bf16)
        assert got_parts[name].dtype == t.dtype and torch.equal(bits(got_parts[name]), bits(t)), name


@pytest.mark.parametrize("type_name", INT4_BLOCK_TYPES + INT8_BLOCK_TYPES)
@pytest.mark.parametrize("rows", [448, 421])  # whole tiles of 64; a short last one
def test_built_by_rows_and_by_pieces_as_whole(type_name, rows, monkeypatch):
    cols = 512
    raw = blocks(type_name, rows, cols)
    want = whole(raw, type_name, (rows, cols))
    monkeypatch.setattr(in_place, "BUILD_WEIGHTS", 128 * cols)  # 128 rows at a time: four parts, the last short
    assert_same(by_rows(raw, type_name, (rows, cols)), want)
    for start, stop in ((0, 192), (192, 256), (256, rows)):
        assert_same(by_rows(raw, type_name, (rows, cols), piece=(start, stop)), want.rows(start, stop))
    with pytest.raises(ValueError, match="kernel tile"):
        by_rows(raw, type_name, (rows, cols), piece=(10, 64))


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("heads, head", [(6, 64), (4, 96), (4, 40)])  # parts of 128, 192 rows; one part
def test_q_k_rows_un_interleaved_by_parts_of_whole_heads(type_name, heads, head, monkeypatch):
    """llama.cpp interleaves q / k rows within each head: built a part of whole heads at a time, each
    part's rows put back as the whole's are."""
    rows, cols = heads * head, 512
    raw = blocks(type_name, rows, cols)
    unmixed = lambda part: unpermute_rows(part, heads)  # noqa: E731
    build = in_place.int4_matrix if type_name in INT4_BLOCK_TYPES else in_place.int8_matrix
    want = build(raw, type_name, (rows, cols), torch.bfloat16, unmixed)
    monkeypatch.setattr(in_place, "BUILD_WEIGHTS", 100 * cols)  # parts of lcm(64, head) rows
    got = in_place.blocks_matrix(lambda start, stop: raw[start:stop], type_name, (rows, cols), torch.bfloat16,
                                 heads=heads)
    if type_name in INT4_BLOCK_TYPES:
        got, want = got.kernel_only(), want.kernel_only()
    assert_same(got, want)


def test_a_part_whose_zeros_are_8_scales_stacks_as_the_whole_holds_them(monkeypatch):
    """Q5_1 rows whose m is -16 d: the 6-bit form's zero 8 d + m + 16 d is 8 times its scale, so a part of
    only such rows holds its scales alone; the whole (other rows beside them) holds pairs, and so do
    the parts stacked (rows that do not fill the tiles: the 6-bit form, not AVX-512's 5-bit one)."""
    rows, cols = 250, 512
    raw = blocks("Q5_1", rows, cols)
    head = raw.reshape(rows, cols // 32, 24)[:128]  # fp16 d, fp16 m, 4 bytes of fifth bits, 16 of nibbles
    head[..., 2:4] = (head[..., 0:2].copy().view(np.float16) * -16).view(np.uint8)
    want = whole(raw, "Q5_1", (rows, cols))
    part = in_place.int8_matrix(raw[:128], "Q5_1", (128, cols), torch.bfloat16, whole_rows=rows)
    assert want.high is not None and want.split.scale_zero.shape[-1] == 2 and part.scales_alone
    monkeypatch.setattr(in_place, "BUILD_WEIGHTS", 128 * cols)
    assert_same(by_rows(raw, "Q5_1", (rows, cols)), want)


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # 5: the peak RSS starts again from the current RSS
        f.write("5")


@pytest.mark.parametrize("type_name", ["Q6_K", "Q5_K", "Q4_K"])
def test_a_big_tables_build_holds_one_parts_transients_beyond_its_form(type_name):
    """A 65536 x 1024 table (a 1B head's kind): built whole from its blocks it held the file's bytes,
    its codes and fp32 scales beside the form (Q6_K 159, Q4_K 381 MiB beyond its form); built a part
    at a time, one part's transients, what `--max-rss` charges (`placement.cost_memory.build_transient_bytes`)."""
    rows, cols = 65536, 1024
    raw = blocks(type_name, rows, cols)
    by_rows(raw[:128], type_name, (128, cols))  # the kernels' and tiles' one-off set-up outside the peak
    before = _rss_kib()
    _reset_peak()
    w = by_rows(raw, type_name, (rows, cols))
    beyond = (_peak_kib() - before) * 1024 - w.nbytes
    assert beyond <= BUILD_WEIGHTS * BUILD_BYTES_PER_WEIGHT, f"{beyond >> 20} MiB beyond its form ({w.nbytes >> 20} MiB)"


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
