"""kernels.half_amx: a bf16 decode row on an AMX CPU gets the same bits at any row count, those of
oneDNN's 32-row calls (what ran before it, and what runs where it does not load)."""

import pytest
import torch

from flexlamps.kernels import loader
from flexlamps.kernels.half_amx import onednn_rows
from flexlamps.models.blocks import dense_gemm
from flexlamps.models.blocks.linear import linear, pack
from flexlamps.models.blocks.weight_kind import Phase


def _kernel():
    kernel = loader.chosen().get("half_amx")
    if kernel is None or torch.bfloat16 not in dense_gemm._ROW_BLOCK_DTYPES:
        pytest.skip("no AMX-BF16 here (or the kernel is off): oneDNN's calls run every bf16 row")
    return kernel


@pytest.fixture
def calls(monkeypatch):
    """Which kernel ran each decode call: "amx" or "onednn"."""
    _kernel()
    seen, amx, blocks = [], dense_gemm._amx_decode, dense_gemm._in_row_blocks

    def taken(*args):
        kernel = amx(*args)
        if kernel is not None:
            seen.append("amx")
        return kernel
    monkeypatch.setattr(dense_gemm, "_amx_decode", taken)
    monkeypatch.setattr(dense_gemm, "_in_row_blocks", lambda *a: seen.append("onednn") or blocks(*a))
    return seen


@pytest.mark.parametrize("out_in,bias", [((512, 2048), False), ((96, 200), True), ((37, 45), True)])
def test_a_decode_row_has_its_bits_at_1_7_32_100_and_1008_rows(calls, out_in, bias):
    """Every row count takes the tiles, with the bits of oneDNN's 32-row calls (`_in_row_blocks`, as
    where the kernel does not load): this fails the moment a row count picks a kernel of other bits."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(*out_in, generator=gen).bfloat16()
    b = torch.randn(out_in[0], generator=gen).bfloat16() if bias else None
    x = torch.randn(1008, out_in[1], generator=gen).bfloat16()
    full = dense_gemm._in_row_blocks(x, w, b, dense_gemm.AMX_ROW_BLOCK)
    del calls[:]
    for rows in (1, 7, 32, 100, 1008):
        assert torch.equal(linear(x[:rows], w, b), full[:rows]), rows
        assert torch.equal(linear(x[rows - 1:rows], w, b), full[rows - 1:rows]), rows
    assert calls == ["amx"] * 10


def test_the_tiles_equal_onednns_32_row_call_at_every_row_count_and_thread_count():
    kernel = _kernel()
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(70, 99, generator=gen).bfloat16()  # partial tiles of outputs and inputs, an odd inner size
    b = torch.randn(70, generator=gen).bfloat16()
    x = torch.randn(64, 99, generator=gen).bfloat16()
    want = torch.cat([onednn_rows(x[i:i + 32], w, b) for i in (0, 32)])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (1, 5, 16, 17, 31, 32, 33, 64):
                assert torch.equal(kernel.matmul(x[:rows], w, b), want[:rows]), (count, rows)
    finally:
        torch.set_num_threads(threads)


def test_prompts_and_packed_weights_keep_onednn_and_pack_leaves_bf16_plain(calls):
    """A prompt's rows have their own block's bits (`AMX_PROMPT_ROW_BLOCK`), and a weight in oneDNN's
    layout is oneDNN's: neither takes the tiles. `pack` leaves a bf16 weight plain (fp32 it packs)."""
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(48, 64).bfloat16()
    linear(x, w, phase=Phase.PROMPT)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 32)
    assert torch.equal(linear(x, packed), linear(x, w))
    assert calls == ["onednn", "onednn", "amx"] and dense_gemm._amx_decode(x, packed, None) is None
    assert pack(w) is w and pack(w.float()).is_mkldnn


def test_a_prompt_of_many_blocks_packs_a_plain_weight_once(monkeypatch):
    """A prompt call of several `AMX_PROMPT_ROW_BLOCK`s on a weight `pack` left plain runs every block on
    one packed copy (`pack(w, for_decode=False)`), not on the plain weight that oneDNN would reorder
    each block (an 8064-row micro-batch: 63 reorders of each weight, 1.4x the products' CPU)."""
    _kernel()
    w = torch.randn(48, 64).bfloat16()
    x = torch.randn(3 * dense_gemm.AMX_PROMPT_ROW_BLOCK + 5, 64).bfloat16()
    assert pack(w) is w and pack(w, for_decode=False).is_mkldnn
    seen, real = [], torch.ops.mkldnn

    class Ops:  # torch.ops.mkldnn with its linear calls' weights recorded
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def _linear_pointwise(rows, weight, *rest):
            seen.append(weight.is_mkldnn)
            return real._linear_pointwise(rows, weight, *rest)
    monkeypatch.setattr(dense_gemm.torch.ops, "mkldnn", Ops(), raising=False)
    got = linear(x, w, phase=Phase.PROMPT)
    monkeypatch.undo()
    assert seen and all(seen), seen
    assert torch.equal(got, linear(x, w, phase=Phase.PROMPT))
