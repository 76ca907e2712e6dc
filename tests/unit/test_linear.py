"""The shared matmul: a row's result never depends on which rows share the call, on whether
the weight is prepacked, or (fp32) on whether the residual add / product is fused into it."""

import pytest
import torch
import torch.nn.functional as F

from flexlamps.models.blocks import dense_gemm
from flexlamps.models.blocks.linear import linear, pack, unpack, uses_onednn
from flexlamps.models.blocks.weight_kind import Phase

SHAPES = [(1536, 576), (576, 1536), (192, 576), (37, 19), (4096, 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_in", SHAPES)
def test_rows_are_independent_of_the_batch(dtype, out_in):
    """Bit for bit in every dtype (on CPUs with AMX, bf16 runs oneDNN calls of a fixed row count)."""
    gen = torch.Generator().manual_seed(0)
    n_out, n_in = out_in
    w = torch.randn(n_out, n_in, generator=gen).to(dtype)
    b = torch.randn(n_out, generator=gen).to(dtype)
    x = torch.randn(300, n_in, generator=gen).to(dtype)
    full = linear(x, w, b)
    for rows in (1, 2, 3, 8, 31, 32, 33, 129):
        assert torch.equal(linear(x[:rows], w, b), full[:rows]), rows
        assert torch.equal(linear(x[rows:rows + 1], w, b), full[rows:rows + 1]), rows
    # a (n, T, in) activation (a prompt's: `phase_of`) gives the same rows as the flattened one in that phase
    prompt = linear(x, w, b, phase=Phase.PROMPT)
    assert torch.equal(linear(x[:240].view(8, 30, n_in), w, b).view(240, n_out), prompt[:240])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_matches_torch_linear(dtype, tol):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(96, 80, generator=gen).to(dtype)
    x = torch.randn(5, 7, 80, generator=gen).to(dtype)
    ref = F.linear(x.float(), w.float())
    got = linear(x, w)
    assert got.shape == ref.shape and got.dtype == dtype
    assert ((got.float() - ref).abs().max() / ref.abs().max()).item() < tol


def test_fp16_and_grad_fall_back_to_torch():
    w = torch.randn(8, 4)
    assert not uses_onednn(torch.randn(2, 4, requires_grad=True), w)
    assert not uses_onednn(torch.randn(2, 4).half(), w.half())
    x = torch.randn(3, 4).half()
    assert torch.equal(linear(x, w.half()), F.linear(x, w.half()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_in", SHAPES)
def test_packed_weights_give_the_same_bits(dtype, out_in):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(*out_in, generator=gen).to(dtype)
    b = torch.randn(out_in[0], generator=gen).to(dtype)
    packed = pack(w)
    assert torch.equal(unpack(packed), w)
    for rows in (1, 2, 7, 32, 300):
        x = torch.randn(rows, out_in[1], generator=gen).to(dtype)
        assert torch.equal(linear(x, packed, b), linear(x, w, b)), rows


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("rows", [1, 2, 5, 64])
def test_fused_post_ops_equal_the_separate_op_in_fp32(op, rows):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(48, 40, generator=gen)
    b = torch.randn(48, generator=gen)
    x = torch.randn(rows, 3, 40, generator=gen)
    other = torch.randn(rows, 3, 48, generator=gen)
    ref = linear(x, w, b) + other if op == "add" else linear(x, w, b) * other
    for weight in (w, pack(w)):
        assert torch.equal(linear(x, weight, b, **{op: other}), ref)
    # bf16 keeps the GEMM output's rounding before the op, as transformers does
    xb, wb, bb, ob = x.bfloat16(), w.bfloat16(), b.bfloat16(), other.bfloat16()
    ref_b = linear(xb, wb, bb) + ob if op == "add" else linear(xb, wb, bb) * ob
    assert torch.equal(linear(xb, pack(wb), bb, **{op: ob}), ref_b)
    # the unfused path (fp16 here: torch's linear, or on AVX2 the native 16-bit kernels) applies the op after
    half = linear(x.half(), w.half(), b.half(), **{op: other.half()})
    plain = linear(x.half(), w.half(), b.half())
    assert torch.equal(half, plain + other.half() if op == "add" else plain * other.half())


def test_add_and_mul_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        linear(torch.randn(2, 4), torch.randn(3, 4), add=torch.randn(2, 3), mul=torch.randn(2, 3))


def test_pack_leaves_weights_it_cannot_speed_up():
    for w in (torch.randn(8, 4).half(), torch.randn(8), torch.randn(8, 4).to(torch.float64)):
        assert pack(w) is w


def test_every_compressed_weight_kind_owns_its_product():
    """linear asks the weight's kind: each kind of compressed weight (and a twin) has one, and
    anything else is a dense tensor."""
    import quant.fp8  # noqa: F401  (each kind registers by subclassing)
    import quant.mxfp4  # noqa: F401
    from flexlamps.models.blocks.linear import KINDS, Int4Twin, kind_of
    from flexlamps.models.blocks.weight_kind import WeightKind
    from quant.compressed_weight import CompressedWeight

    kinds = set(CompressedWeight.__subclasses__())
    assert kinds and kinds | {Int4Twin, torch.Tensor} == set(KINDS)
    assert all(isinstance(kind, WeightKind) for kind in KINDS.values())
    assert kind_of(torch.nn.Parameter(torch.randn(2, 2))) is KINDS[torch.Tensor]


def test_compressed_weights_move_their_parts_together():
    from quant.compressed_weight import CompressedWeight
    from quant.int4_weight import Int4Weight
    from quant.int8_weight import Int8Weight

    w4 = Int4Weight.quantize(torch.randn(64, 64), 32, torch.float32)
    w8 = Int8Weight.from_codes(torch.randint(-128, 128, (64, 64), dtype=torch.int8), torch.rand(64, 2),
                               dtype=torch.float32)
    for w in (w4, w8):
        assert isinstance(w, CompressedWeight) and w.to("cpu") is w
        assert w.nbytes == sum(t.numel() * t.element_size() for t in w.to_tensors(with_kernel=True).values()
                               if t.dtype != torch.int32)
    assert Int4Weight.is_stored(w4.to_tensors("a."), "a.") and not Int8Weight.is_stored(w4.to_tensors("a."), "a.")
    assert set(Int8Weight.part_names("b.")) <= set(w8.to_tensors("b."))


@pytest.mark.parametrize("out_in", SHAPES)
def test_a_prompts_bf16_rows_are_independent_of_the_batch_and_near_decodes(out_in):
    """A prompt's rows (on CPUs with AMX: oneDNN calls of `AMX_PROMPT_ROW_BLOCK` rows, not decode's 32) get
    their bits at any row count and position; within a rounding step or two of the same rows as decode."""
    gen = torch.Generator().manual_seed(5)
    n_out, n_in = out_in
    w = torch.randn(n_out, n_in, generator=gen).bfloat16()
    x = torch.randn(300, n_in, generator=gen).bfloat16()
    full = linear(x, w, phase=Phase.PROMPT)
    for rows in (1, 3, 32, 33, 127, 128, 129, 200):
        assert torch.equal(linear(x[:rows], w, phase=Phase.PROMPT), full[:rows]), rows
        assert torch.equal(linear(x[rows:rows + 5], w, phase=Phase.PROMPT), full[rows:rows + 5]), rows
    decode = linear(x, w, phase=Phase.DECODE)
    assert torch.allclose(full.float(), decode.float(), rtol=2 ** -6, atol=2 ** -6 * decode.float().abs().max().item())


def test_on_an_amx_cpu_a_prompts_bf16_rows_run_in_calls_of_the_prompt_block(monkeypatch):
    if torch.bfloat16 not in dense_gemm._ROW_BLOCK_DTYPES:
        pytest.skip("no AMX here: oneDNN's bf16 rows need no fixed call size")
    blocks, run = [], dense_gemm._in_row_blocks
    monkeypatch.setattr(dense_gemm, "_in_row_blocks", lambda rows, w, b, block: blocks.append(block) or run(rows, w, b, block))
    monkeypatch.setattr(dense_gemm, "_amx_decode", lambda *a: None)  # (decode's rows where kernels.half_amx does not run)
    x, w = torch.randn(200, 64).bfloat16(), torch.randn(48, 64).bfloat16()
    linear(x, w, phase=Phase.PROMPT)
    linear(x, w, phase=Phase.DECODE)
    assert blocks == [dense_gemm.AMX_PROMPT_ROW_BLOCK, dense_gemm.AMX_ROW_BLOCK] and blocks[0] > blocks[1]


def test_on_an_amx_cpu_rows_beyond_a_block_are_not_copied_padded(monkeypatch):
    """More rows than a block end in a call on the last block's worth (overlapping the one before),
    not a zero-padded copy of them all (a 504-row MoE expert's product spent ~20% in it); fewer are
    padded. The bits are the padded calls' (`test_a_prompts_bf16_rows_are_independent_of_the_batch...`)."""
    if torch.bfloat16 not in dense_gemm._ROW_BLOCK_DTYPES:
        pytest.skip("no AMX here: oneDNN's bf16 rows need no fixed call size")
    pads, pad = [], dense_gemm.F.pad
    monkeypatch.setattr(dense_gemm.F, "pad", lambda t, *a, **k: pads.append(tuple(t.shape)) or pad(t, *a, **k))
    gen = torch.Generator().manual_seed(6)
    x, w = torch.randn(300, 64, generator=gen).bfloat16(), torch.randn(48, 64, generator=gen).bfloat16()
    many = linear(x, w, phase=Phase.PROMPT)
    assert pads == []
    few = linear(x[250:], w, phase=Phase.PROMPT)
    assert pads == [(50, 64)] and torch.equal(few, many[250:])


def test_prompts_take_the_codes_beside_a_fast_dense_gemm_on_every_variant(monkeypatch):
    """Where our kernel runs, prompts multiply the codes whatever the dense GEMM's speed (an AVX-512
    CPU without AMX as on AMX): the same bits as the codes' own product, no dense twin made."""
    from flexlamps.models.blocks import coded_weights
    from quant.int4_weight import Int4Weight

    if coded_weights.native_kernel() is None:
        pytest.skip("no native kernel on this CPU")
    monkeypatch.setattr(coded_weights, "fast_dense_gemm", lambda x: True)
    g = torch.Generator().manual_seed(3)
    w = Int4Weight.quantize(torch.randn(128, 256, generator=g), 32, torch.bfloat16).kernel_only()
    x = torch.randn(40, 256, generator=g).bfloat16()
    assert coded_weights.prompts_take_codes(x) and coded_weights.codes_serve_both_phases(w)
    assert torch.equal(linear(x, w, phase=Phase.PROMPT), coded_weights.codes_prompt_product(w, x))
