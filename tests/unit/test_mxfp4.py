"""MXFP4 weights (gpt-oss's experts): dequantized exactly as transformers does, kept 4-bit."""

import pytest
import torch

from flexlamps.models.blocks.linear import linear
from quant.mxfp4 import MXFP4_BLOCK, Mxfp4Weight, dequantize_mxfp4, mxfp4_nbytes


def _random_mxfp4(experts: int, rows: int, cols: int, seed: int = 0):
    """gpt-oss's stored layout: blocks (E, rows, cols / 32, 16) and scales (E, rows, cols / 32)."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, cols // MXFP4_BLOCK, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, (experts, rows, cols // MXFP4_BLOCK), generator=g, dtype=torch.uint8)
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_transformers_bit_for_bit(dtype):
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    blocks, scales = _random_mxfp4(3, 48, 64)
    scales[0, 0, 0], scales[0, 1, 1] = 0, 254  # the extremes: tiny (subnormal / zero) and huge
    expected = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # (E, in, out)
    for e in range(3):
        ours = dequantize_mxfp4(blocks[e].reshape(48, -1), scales[e], dtype)  # (out, in)
        assert ours.dtype == dtype and torch.equal(ours, expected[e].T)


def test_weight_stays_four_bit_and_multiplies_as_its_dequantized_matrix():
    blocks, scales = _random_mxfp4(1, 40, 96, seed=1)
    w = Mxfp4Weight(blocks[0].reshape(40, -1), scales[0], torch.float32)
    assert w.shape == (40, 96) and w.nbytes == 40 * 96 // 2 + 40 * 96 // 32
    assert mxfp4_nbytes(w.shape) == sum(t.numel() * t.element_size() for t in w.to_tensors().values())
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(2))
    dense = w.dequantize()
    assert torch.equal(linear(x, w), torch.nn.functional.linear(x, dense))
    back = Mxfp4Weight.from_tensors(w.to_tensors("p::"), "p::")
    assert torch.equal(back.codes, w.codes) and torch.equal(back.scales, w.scales) and back.dtype == w.dtype


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        Mxfp4Weight(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 0, dtype=torch.uint8), torch.float32)
    with pytest.raises(ValueError, match="needs codes"):
        Mxfp4Weight(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8), torch.float32)


def test_ggml_mxfp4_blocks_hold_the_values_gguf_dequantizes():
    """llama.cpp's MXFP4 blocks (another nibble order) become the same codes and exponents."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from flexlamps.models.loading.gguf_blocks import mxfp4_blocks

    values = np.random.default_rng(0).normal(0, 0.3, (24, 96)).astype(np.float32)
    values[0, :32] = 0.0  # an all-zero block: exponent 0
    raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType.MXFP4)
    codes, scales = mxfp4_blocks(raw, (24, 96))
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).astype(np.float32))
    assert torch.equal(Mxfp4Weight(codes, scales, torch.float32).dequantize(), want)
