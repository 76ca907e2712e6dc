"""Q8_0 computed in place (`quant.int8_weight.Int8Weight`): the file's int8 codes and block scales
are the weight, the split into two 4-bit halves multiplies exactly `round(d) * q`, and a model
whose matrices are all Q8_0 gives the fp32 reference's logits within bf16's error, like a bf16
copy does, and the same greedy tokens."""

from pathlib import Path

import numpy as np
import pytest
import torch

from flexlamps.models.loading.checkpoint import GGUFReader, read_all
from flexlamps.models.loading.gguf_blocks import int8_blocks
from flexlamps.models.blocks.coded_weights import prompts_take_codes
from flexlamps.models.blocks.linear import Int4Twin, Phase, codes_prompt_product, fused_product, linear
from flexlamps.models.loading.weight_cache import load_weights
from flexlamps.settings import RunSettings
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight, split_codes
from tests.gguf_models import (assert_as_good_as_a_bf16_copy, assert_cache_gives_back_the_same_weights,
                                prefill_and_decode_logits)
from tests.unit.test_weight_cache import write_tiny_gguf

@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("q8") / "q8.gguf", all_q8_0=True)


def _random_int8(rows, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (rows, cols), dtype=torch.int8, generator=g)
    scale = (torch.rand(rows, cols // 32, generator=g) * 0.02 + 1e-3).half().float()
    return codes, scale


def test_q8_0_blocks_map_exactly():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    dense = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    raw = quantize(dense, GGMLQuantizationType.Q8_0)
    codes, scale, zero = int8_blocks(raw, (48, 96))
    assert zero is None
    got = (codes.float().reshape(48, 3, 32) * scale[..., None]).reshape(48, 96)
    ref = torch.from_numpy(np.asarray(dequantize(raw, GGMLQuantizationType.Q8_0), dtype=np.float32))
    assert codes.dtype == torch.int8 and torch.equal(got, ref)


@pytest.mark.parametrize("shape", [(128, 96), (48, 64)])  # kernel tiles alone; the last one padded
def test_split_halves_multiply_round_d_times_q(shape):
    codes, scale = _random_int8(*shape)
    w = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16)
    exact = (codes.float().reshape(shape[0], -1, 32) * scale.bfloat16().float()[..., None]).reshape(shape)
    assert torch.equal(w.dequantize(torch.float32), exact)
    assert torch.equal(w.dequantize(), exact.bfloat16())
    assert w.split.codes is None and w.nbytes <= 1.25 * codes.numel() + 64 * shape[1]  # + a tile's padding at most
    packed = Int4Weight.from_codes(*split_codes(codes, scale), 32, torch.bfloat16).kernel_only()  # torch's packer
    assert torch.equal(w.split.kernel_codes, packed.kernel_codes) and torch.equal(w.split.scale_zero, packed.scale_zero)
    x = torch.randn(3, shape[1], dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
    back = Int8Weight.from_tensors(w.to_tensors("p.", with_kernel=True), "p.")
    assert torch.equal(back.dequantize(), w.dequantize())
    if w.can_run_fused(x):  # torch's kernel: not on tiles padded past the rows (ours read them: test_partial_tiles)
        want = x.float() @ exact.t()
        torch.testing.assert_close(w.matmul(x).float(), want, rtol=2**-7, atol=2**-7 * want.abs().max().item())
        assert torch.equal(back.matmul(x), w.matmul(x))


def test_cat_stacks_output_rows():
    parts = [Int8Weight.from_codes(*_random_int8(rows, 96, seed=rows), 32, torch.bfloat16) for rows in (128, 64)]
    both = Int8Weight.cat(parts)
    x = torch.randn(2, 96, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    assert both.shape == (192, 96) and torch.equal(both.dequantize(), torch.cat([p.dequantize() for p in parts]))
    assert torch.equal(both.matmul(x), torch.cat([p.matmul(x) for p in parts], dim=-1))


def test_linear_takes_one_kernel_per_phase_whatever_the_rows():
    codes, scale = _random_int8(128, 96)
    w = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16)
    twin = Int4Twin(w)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 96, dtype=torch.bfloat16, generator=g)
    dense = linear(x, w.dequantize())
    assert torch.equal(linear(x, twin, phase=Phase.DECODE), fused_product(w, x))  # decode: on the codes
    prompt = linear(x, twin, phase=Phase.PROMPT)
    on_codes = codes_prompt_product(w, x)  # the many-row kernel on the codes, where it runs (AVX2, AMX)
    want = dense if not prompts_take_codes(x) else fused_product(w, x) if on_codes is None else on_codes
    assert torch.equal(prompt, want)
    for rows in (1, 2, 3, 8, 16):
        for phase, want in ((Phase.DECODE, fused_product(w, x)), (Phase.PROMPT, prompt)):
            assert torch.equal(linear(x[:rows], twin, phase=phase), want[:rows]), (phase, rows)
            assert torch.equal(linear(x[:rows], w, phase=phase), want[:rows]), (phase, rows)
    torch.testing.assert_close(linear(x, w).float(), dense.float(), rtol=2**-7, atol=2**-7 * dense.abs().max().item())


def _logits(weights, reader, dtype, feed=None, **kw):
    return prefill_and_decode_logits(weights, reader, dtype, steps=6, feed=feed, **kw)


def test_all_q8_0_model_keeps_quality(q8_gguf):
    """Within 10% of the largest fp32 logit and within twice the bf16 copy's own error (0.9-1.6x
    seen), fed the same tokens; greedy picks agree with fp32 at least as often as the bf16 copy's,
    less one."""
    reader = GGUFReader(q8_gguf)
    assert reader.has_quantized_weights and not reader.has_int4_weights
    assert RunSettings(dtype="auto").resolve_dtype(reader) == torch.bfloat16
    weights = read_all(reader, torch.bfloat16, int4_in_place=True)
    assert isinstance(weights["layers.1.down_proj"], Int8Weight) and isinstance(weights["lm_head"], Int8Weight)
    assert not isinstance(weights["embed_tokens"], Int8Weight)  # the lookup reads the dense table
    ref = _logits(read_all(reader, torch.float32), reader, torch.float32)
    bf16_copy = _logits(read_all(reader, torch.bfloat16), reader, torch.bfloat16, feed=ref[2])
    for twins in (False, True):
        int8 = _logits(weights, reader, torch.bfloat16, feed=ref[2], dense_twins=twins)
        assert_as_good_as_a_bf16_copy(int8, bf16_copy, ref)


def test_cache_keeps_q8_0_int8(q8_gguf, tmp_path):
    cache = tmp_path / "cache"
    second = assert_cache_gives_back_the_same_weights(q8_gguf, cache)
    assert isinstance(second["lm_head"], Int8Weight) and isinstance(second["layers.0.q_proj"], Int8Weight)
    fp32 = load_weights(GGUFReader(q8_gguf), torch.float32, int4_in_place=True, cache_dir=cache)
    assert "lm_head" not in fp32 and not any(isinstance(w, Int8Weight) for w in fp32.values())  # fp32 stays exact
