"""4-bit weights multiplied in place: the Int4Weight layout, GGUF's Q4 blocks mapped onto it,
and `models.linear` picking the fused kernel or the dense path by row count."""

import numpy as np
import pytest
import torch

from flexlamps.models.loading.gguf_blocks import int4_blocks
from flexlamps.models.blocks.dense_gemm import fast_dense_gemm
from flexlamps.models.blocks.coded_weights import prompts_take_codes
from flexlamps.models.blocks.linear import (INT4_DENSE_FROM_ROWS, Int4Twin, Phase, codes_prompt_product, fused_product, fuses,
                                             int8_product, linear, with_dense_twin)
from quant.int4_weight import Int4Weight, can_pack, pack_codes, unpack_codes


def _random_weight(rows=64, cols=96, group=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.uint8)
    scale = torch.rand(rows, cols // group, generator=g) / 10 + 0.01
    zero = torch.randn(rows, cols // group, generator=g) / 10
    return codes, scale, zero


def _dense(codes, scale, zero, group=32, dtype=torch.bfloat16):
    """w = (q - 8) * scale + zero with scale and zero rounded to `dtype` as Int4Weight stores them."""
    s = scale.to(dtype).float().repeat_interleave(group, 1)
    z = zero.to(dtype).float().repeat_interleave(group, 1)
    return (codes.float() - 8) * s + z


def test_codes_pack_round_trip():
    codes, _, _ = _random_weight()
    assert torch.equal(unpack_codes(pack_codes(codes)), codes)


def test_dequantize_is_the_group_formula():
    codes, scale, zero = _random_weight()
    w = Int4Weight.from_codes(codes, scale, zero, 32)
    assert w.shape == (64, 96) and w.kernel_codes is not None
    torch.testing.assert_close(w.dequantize(torch.float32), _dense(codes, scale, zero), rtol=1e-6, atol=1e-6)


def test_fused_kernel_matches_the_dense_weight():
    codes, scale, zero = _random_weight()
    w = Int4Weight.from_codes(codes, scale, zero, 32)
    x = torch.randn(3, 96, dtype=torch.bfloat16)
    ref = x.float() @ _dense(codes, scale, zero).t()
    torch.testing.assert_close(w.matmul(x).float(), ref, rtol=2 ** -7, atol=2 ** -7 * ref.abs().max().item())


def test_quantize_error_is_within_half_a_step():
    dense = torch.randn(32, 64)
    w = Int4Weight.quantize(dense, group_size=32, dtype=torch.float32)
    step = w.scale_zero[..., 0].t().repeat_interleave(32, 1)
    assert ((w.dequantize() - dense).abs() <= step / 2 + 1e-6).all()


def _path_by_phase(w, x, phase, bias=None):
    """What `linear` must give for x in `phase` (`coded_weights.CodesKind`): the fused kernel
    in decode; in a prompt where this CPU has no fast dense GEMM for x's dtype or our many-row kernel
    runs on AMX tiles (`prompts_take_codes`), that kernel on the codes (where it runs) or the fused
    one; else the int8 GEMM where it takes x, or the dense GEMM on the dequantized weight (the bias
    inside it)."""
    add = (lambda out: out) if bias is None else (lambda out: out + bias)
    if phase is Phase.PROMPT and prompts_take_codes(x) and (on_codes := codes_prompt_product(w, x)) is not None:
        return add(on_codes)
    if phase is Phase.DECODE or not fast_dense_gemm(x):
        if fuses(w, x):
            return add(fused_product(w, x))
    elif (on_int8 := int8_product(w, x)) is not None:
        return add(on_int8)
    return linear(x, w.dequantize(x.dtype), bias)


def test_linear_chooses_the_kernel_by_phase_never_by_rows():
    codes, scale, zero = _random_weight()
    w = Int4Weight.from_codes(codes, scale, zero, 32)
    bias = torch.randn(64, dtype=torch.bfloat16)
    for phase in Phase:
        x = torch.randn(40, 96, dtype=torch.bfloat16)
        want = _path_by_phase(w, x, phase, bias)
        for rows in (1, 2, 3, 17, 40):  # a row's bits do not depend on the rows beside it
            assert torch.equal(linear(x[:rows], w, bias, phase=phase), want[:rows]), (phase, rows)
    # a forward's (n, T, in) activations: T > 1 is a prompt, T == 1 decode
    x = torch.randn(3, 5, 96, dtype=torch.bfloat16)
    assert torch.equal(linear(x, w), _path_by_phase(w, x.reshape(15, 96), Phase.PROMPT).view(3, 5, 64))
    assert torch.equal(linear(x[:, :1], w), _path_by_phase(w, x[:, 0], Phase.DECODE)[:, None])
    x32 = torch.randn(3, 96)  # fp32 activations: the dense fp32 path, exact to the fp32 weight
    assert torch.equal(linear(x32[:1], w), linear(x32[:1], w.dequantize(torch.float32)))


def test_a_dense_twin_gives_its_plain_weights_bits_in_both_phases():
    codes, scale, zero = _random_weight()
    w = Int4Weight.from_codes(codes, scale, zero, 32)
    twin = with_dense_twin(w)
    assert isinstance(twin, Int4Twin) and twin.shape == w.shape and twin.nbytes == w.nbytes + 64 * 96 * 2
    bias, add = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    for phase in Phase:
        for rows in (1, 2, 16, 40):
            x = torch.randn(rows, 96, dtype=torch.bfloat16)
            want = linear(x, w, bias, add=add.expand(rows, -1), phase=phase)
            assert torch.equal(linear(x, twin, bias, add=add.expand(rows, -1), phase=phase), want), (phase, rows)
    x32 = torch.randn(3, 96)  # fp32 activations: the fp32 dense path, as without the twin
    assert torch.equal(linear(x32, twin), linear(x32, w))
    assert with_dense_twin(w.dequantize()) is not None and not isinstance(with_dense_twin(w.dequantize()), Int4Twin)
    x = torch.randn(40, 96, dtype=torch.bfloat16)
    for plain in (w.dequantize(), lambda: w.dequantize(), lambda: None, torch.zeros(64, 95, dtype=torch.bfloat16)):
        # the dense copy given, read when first needed, unreadable or not this weight's: the same results
        assert torch.equal(linear(x, with_dense_twin(w, plain), phase=Phase.PROMPT),
                           linear(x, twin, phase=Phase.PROMPT)), plain
    for _ in range(4):  # served plain, then packed: the same bits
        assert torch.equal(linear(x, twin, phase=Phase.PROMPT), linear(x, w, phase=Phase.PROMPT))


def test_shapes_the_kernel_refuses_still_compute(monkeypatch):
    from flexlamps.models.blocks import coded_weights

    codes, scale, zero = _random_weight(rows=40)  # torch's CPU kernel needs rows divisible by 16
    assert not can_pack((40, 96), 32)
    w = Int4Weight.from_codes(codes, scale, zero, 32)
    x = torch.randn(1, 96, dtype=torch.bfloat16)
    assert not w.can_run_fused(x)  # only our kernels read its tiles, padded to whole ones (test_partial_tiles)
    monkeypatch.setattr(coded_weights, "native_kernel", lambda: None)
    assert torch.equal(linear(x, w), linear(x, w.dequantize()))


def test_tensors_round_trip():
    w = Int4Weight.from_codes(*_random_weight(), 32)
    back = Int4Weight.from_tensors(w.to_tensors("p."), "p.")
    assert torch.equal(back.codes, w.codes) and torch.equal(back.scale_zero, w.scale_zero)
    assert torch.equal(back.kernel_codes, w.kernel_codes) and back.group_size == 32


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_gguf_blocks_map_exactly(type_name):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[type_name]
    dense = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)
    raw = quantize(dense, qtype)
    ref = torch.from_numpy(np.asarray(dequantize(raw, qtype), dtype=np.float32))
    codes, scale, zero = int4_blocks(raw, type_name, (48, 64))
    got = ((codes.float() - 8).reshape(48, 2, 32) * scale[..., None] + zero[..., None]).reshape(48, 64)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    if type_name == "Q4_0":
        assert torch.equal(zero, torch.zeros_like(zero))


def test_gguf_reader_keeps_q4_weights_4bit(smollm2_path):
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.models.weight_specs import weight_specs

    reader = open_checkpoint(smollm2_path)  # Q4_1 layers, q/k rows permuted by llama.cpp
    assert reader.has_int4_weights
    specs = {s.name: s for s in weight_specs(reader.config)}
    for name in ("layers.0.q_proj", "layers.0.k_proj", "layers.0.down_proj"):
        w = reader.read_int4(specs[name], torch.float32)
        torch.testing.assert_close(w.dequantize(), reader.read(specs[name], torch.float32), rtol=0, atol=1e-6)
    assert reader.read_int4(specs["embed_tokens"], torch.bfloat16) is None  # Q8_0 stays dense
    assert reader.read_int4(specs["layers.0.attn_norm"], torch.bfloat16) is None


@pytest.mark.parametrize("rows", [(64, 128), (48, 32)])  # stacked kernel layouts, and rebuilt ones
def test_cat_stacks_output_rows(rows):
    parts = [Int4Weight.from_codes(*_random_weight(rows=r, seed=r), 32) for r in rows]
    both = Int4Weight.cat(parts)
    x = torch.randn(3, 96, dtype=torch.bfloat16)
    if all(w.can_run_fused(x) for w in (both, *parts)):  # torch's layout (not our tiles padded past the rows)
        torch.testing.assert_close(both.matmul(x), torch.cat([p.matmul(x) for p in parts], dim=-1), rtol=0, atol=0)
    assert torch.equal(both.dequantize(), torch.cat([p.dequantize() for p in parts]))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols, group", [(64, 96, 32), (64, 256, 64), (128, 512, 128), (48, 1024, 32)])
def test_on_cuda_the_fused_kernel_matches_the_dense_weight(rows, cols, group):
    """The CUDA path (tinygemm's layout, rebuilt by `to`): the same dequantized values as on the
    CPU, the fused kernel within bf16 rounding of them, the dense path for many rows, and the
    codes unchanged on the way back."""
    codes, scale, zero = _random_weight(rows, cols, group)
    cpu = Int4Weight.from_codes(codes, scale, zero, group)
    w = cpu.to("cuda")
    assert w.kernel_codes is not None and w.kernel_codes.is_cuda
    # tinygemm's layout alone on the GPU: 4 bits a weight, as the planner charges
    assert w.codes is None and w.shape == (rows, cols)
    assert w.nbytes == rows * cols // 2 + w.scale_zero.numel() * w.scale_zero.element_size()
    assert torch.equal(w.dequantize(torch.float32).cpu(), cpu.dequantize(torch.float32))
    dense = _dense(codes, scale, zero, group)
    for n in (1, 3, INT4_DENSE_FROM_ROWS):
        x = torch.randn(n, cols, dtype=torch.bfloat16)
        ref = x.float() @ dense.t()
        got = linear(x.cuda(), w).float().cpu()
        torch.testing.assert_close(got, ref, rtol=2 ** -7, atol=2 ** -7 * ref.abs().max().item())
    assert torch.equal(w.to("cpu").plain_codes(), cpu.plain_codes())
    cat = Int4Weight.cat([w, w])
    assert cat.codes is None and cat.shape == (2 * rows, cols)
    x = torch.randn(2, cols, dtype=torch.bfloat16, device="cuda")
    assert torch.equal(linear(x, cat), torch.cat([linear(x, w), linear(x, w)], dim=1))
