"""GGUF files as llama.cpp's Q4_K_M writes them: Q4_K, Q5_0 and Q6_K blocks computed in place
(Q4_K as `Int4Weight` groups of 32, Q5_0 as `Int8Weight` codes, Q6_K as `Int8Weight` codes in
groups of 16). The blocks map exactly onto what the `gguf` package dequantizes, and a model
mixing the three keeps the fp32 engine's logits within a bf16 copy's own error."""

from pathlib import Path

import numpy as np
import pytest
import torch

from flexlamps.models.loading.checkpoint import GGUFReader, read_all
from flexlamps.models.loading.gguf_blocks import int4_blocks, int8_blocks
from flexlamps.models.blocks.linear import native_kernel
from flexlamps.settings import RunSettings
from quant.int4_tiles import tile_rows
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight
from tests.gguf_models import (assert_cache_gives_back_the_same_weights, assert_int8_x_as_good_as_a_bf16_copy,
                                prefill_and_decode_logits, random_k_blocks, write_llama_gguf)

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 64


def kquant_types(name: str, layer: int | None) -> str | None:
    """llama.cpp's Q4_K_M types for a small model: Q4_K q/k/o/gate/up and a tied Q4_K embedding
    table, Q5_0 v (Q4_K's fallback), Q6_K down in layer 0 and Q4_K in layer 1, f32 norms; layer 1's
    k and v are Q5_1 and its gate Q5_K instead (a Q5_K_M's types)."""
    if name.endswith("norm"):
        return None
    first = {"attn_k": "Q4_K", "attn_v": "Q5_0", "ffn_gate": "Q4_K", "ffn_down": "Q6_K"}
    later = {"attn_k": "Q5_1", "attn_v": "Q5_1", "ffn_gate": "Q5_K", "ffn_down": "Q4_K"}
    return (first if layer == 0 else later).get(name, "Q4_K")


def write_kquant_gguf(path: Path, seed: int = 0) -> Path:
    """A 2-layer LLaMA GGUF typed as `kquant_types`."""
    return write_llama_gguf(path, kquant_types, seed=seed, hidden=HIDDEN, ffn=FFN, layers=LAYERS, heads=HEADS,
                            kv_heads=KV_HEADS, vocab=VOCAB)


@pytest.fixture
def kquant_gguf(tmp_path) -> Path:
    return write_kquant_gguf(tmp_path / "kquant.gguf")


@pytest.mark.parametrize("shape", [(3, 256), (5, 768)])
def test_q4_k_blocks_are_exactly_what_gguf_dequantizes(shape):
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    raw = random_k_blocks(np.random.default_rng(shape[1]), *shape, "Q4_K")
    codes, scale, zero = int4_blocks(raw, "Q4_K", shape)
    assert codes.shape == shape and int(codes.max()) <= 15 and scale.shape == zero.shape == (shape[0], shape[1] // 32)
    values = ((codes.float() - 8).view(shape[0], -1, 32) * scale[..., None] + zero[..., None]).view(shape)
    want = torch.from_numpy(dequantize(raw, T.Q4_K).reshape(shape))
    torch.testing.assert_close(values, want, rtol=0, atol=1e-6 * want.abs().max().item())


@pytest.mark.parametrize("rows_at_a_time", [4096, 2])  # 2: decoded in three pieces, the last one short
def test_q6_k_blocks_are_exactly_what_gguf_dequantizes(rows_at_a_time, monkeypatch):
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from flexlamps.models.loading import gguf_blocks

    monkeypatch.setattr(gguf_blocks, "_Q6_K_ROWS", rows_at_a_time)
    raw = random_k_blocks(np.random.default_rng(6), 5, 512, "Q6_K")
    codes, scale, zero = int8_blocks(raw, (5, 512), "Q6_K")
    assert codes.dtype == torch.int8 and int(codes.min()) == -32 and int(codes.max()) == 31
    assert zero is None and scale.shape == (5, 512 // 16)
    values = codes.float().view(5, 32, 16) * scale[..., None]
    assert torch.equal(values.view(5, 512), torch.from_numpy(dequantize(raw, T.Q6_K).reshape(5, 512)))


@pytest.mark.parametrize("native", [True, False], ids=["avx512-kernel", "torch-only"])
def test_groups_of_16_multiply_in_place_where_our_kernel_runs_else_dense(native, monkeypatch):
    """An `Int8Weight` in Q6_K's groups of 16: our AVX-512 kernel multiplies it in place (as it
    does groups of 32); torch's int4 kernel takes no such groups, so without ours `models.linear`
    runs it on its dequantized values, and nothing calls torch's kernel with it."""
    from flexlamps.models.blocks import coded_weights, linear as lin
    from flexlamps.kernels.tile_gemv import rounded_like_kernel

    g = torch.Generator().manual_seed(16)
    codes = torch.randint(-32, 32, (128, 256), dtype=torch.int8, generator=g)
    scale = torch.rand(128, 16, generator=g) * 0.01 + 1e-3
    w = Int8Weight.from_codes(codes, scale, 16, torch.bfloat16)
    assert w.group_size == 16 and not w.can_run_fused(torch.zeros(1, 256, dtype=torch.bfloat16))
    assert torch.equal(w.dequantize(torch.float32), codes.float() * scale.bfloat16().float().repeat_interleave(16, 1))
    if not native:
        monkeypatch.setattr(coded_weights, "native_kernel", lambda: None)
    elif lin.native_kernel() is None:
        pytest.skip("no AVX-512 kernel on this CPU")
    x = torch.randn(3, 256, generator=g).bfloat16()
    if native:  # x rounded to the kernel's codes, times the exact weight
        want = rounded_like_kernel(x, 16, lin.native_kernel().x_bits) @ w.dequantize(torch.float32).t()
    else:  # the dense GEMM on the bf16 copy
        want = x.float() @ w.dequantize(torch.bfloat16).float().t()
    assert lin.fuses(w, x) == native
    got = lin.linear(x, lin.with_dense_twin(w))
    torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())
    torch.testing.assert_close(lin.linear(x, w).float(), want, rtol=2 ** -7, atol=1e-3 * want.abs().max().item())


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1", "Q5_K"])
def test_five_bit_blocks_are_exactly_what_gguf_dequantizes(type_name):
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(1)
    if type_name == "Q5_K":
        raw = random_k_blocks(rng, 5, 512, "Q5_K")
    else:
        raw = quantize((rng.standard_normal((5, 512)) + 0.3).astype(np.float32), T[type_name])
    codes, scale, zero = int8_blocks(raw, (5, 512), type_name)
    assert codes.dtype == torch.int8 and int(codes.min()) == -16 and int(codes.max()) == 15
    assert (zero is None) == (type_name == "Q5_0")
    values = codes.float().view(5, 16, 32) * scale[..., None] + (0 if zero is None else zero[..., None])
    want = torch.from_numpy(dequantize(raw, T[type_name]).reshape(5, 512))
    torch.testing.assert_close(values.view(5, 512), want, rtol=0, atol=1e-6 * want.abs().max().item())


def test_int8_weight_with_a_zero_point_multiplies_and_dequantizes_as_its_values():
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(-16, 16, (64, 96), dtype=torch.int8, generator=g)
    scale = torch.rand(64, 3, generator=g) * 0.02 + 1e-3
    zero = torch.randn(64, 3, generator=g) * 0.05
    w = Int8Weight.from_codes(codes, scale, 32, torch.bfloat16, zero=zero)
    s, z = scale.bfloat16().float(), (8 * scale + zero).bfloat16().float() - 8 * scale.bfloat16().float()
    exact = (codes.float().view(64, 3, 32) * s[..., None] + z[..., None]).view(64, 96)
    assert torch.equal(w.dequantize(torch.float32), exact)
    x = torch.randn(2, 96, generator=g).bfloat16()
    torch.testing.assert_close(w.matmul(x).float(), x.float() @ exact.t(), rtol=2e-2, atol=2e-2)
    assert not torch.equal(w.dequantize(torch.float32), Int8Weight.from_codes(codes, scale, 32).dequantize(torch.float32))


def test_every_matrix_kept_as_blocks_holds_the_files_values(kquant_gguf):
    """Each matrix read as blocks (q/k rows put back in HF order with their scales and zeros)
    dequantizes to what the gguf package's float read gives, to bf16's rounding of the scales
    and zero points."""
    from flexlamps.models.weight_specs import weight_specs

    reader = GGUFReader(kquant_gguf)
    kinds = set()
    for spec in weight_specs(reader.config):
        if spec.role != "linear":
            continue
        w = reader.read_int4(spec, torch.bfloat16) or reader.read_int8(spec, torch.bfloat16)
        if w is None:
            continue
        kinds.add(type(w))
        want = reader.read(spec, torch.float32)
        torch.testing.assert_close(w.dequantize(torch.float32), want, rtol=0, atol=2**-7 * want.abs().max().item(),
                                   msg=spec.name)
    assert kinds == {Int4Weight, Int8Weight}


def _logits(weights, reader, dtype, feed=None):
    return prefill_and_decode_logits(weights, reader, dtype, steps=4, feed=feed)


def test_q4_k_m_model_computes_its_blocks_in_place_and_keeps_quality(kquant_gguf):
    reader = GGUFReader(kquant_gguf)
    assert reader.has_int4_weights and RunSettings(dtype="auto").resolve_dtype(reader) == torch.bfloat16
    weights = read_all(reader, torch.bfloat16, int4_in_place=True)
    assert isinstance(weights["layers.0.q_proj"], Int4Weight) and isinstance(weights["layers.1.down_proj"], Int4Weight)
    assert all(isinstance(weights[n], Int8Weight) for n in ("layers.0.v_proj", "layers.1.k_proj", "layers.1.gate_proj"))
    assert isinstance(weights["layers.0.down_proj"], Int8Weight) and weights["layers.0.down_proj"].group_size == 16
    # Q5_0 / Q5_1 / Q5_K codes in 5 bits where our AVX-512 kernel multiplies them, else the split
    five_bit = native_kernel() is not None and native_kernel().takes_five_bit and tile_rows(HIDDEN) == 64
    assert all((weights[n].fifth is not None) == five_bit for n in ("layers.0.v_proj", "layers.1.k_proj"))
    assert isinstance(weights["lm_head"], Int4Weight) and type(weights["embed_tokens"]) is torch.Tensor  # tied
    ref = _logits(read_all(reader, torch.float32), reader, torch.float32)
    bf16_copy = _logits(read_all(reader, torch.bfloat16), reader, torch.bfloat16, feed=ref[2])
    assert_int8_x_as_good_as_a_bf16_copy(_logits(weights, reader, torch.bfloat16, feed=ref[2]), bf16_copy, ref)


def test_cache_keeps_the_blocks(kquant_gguf, tmp_path):
    assert "lm_head" in assert_cache_gives_back_the_same_weights(kquant_gguf, tmp_path / "cache")


def test_offloaded_4bit_tiers_keep_the_q4_k_blocks(kquant_gguf, tmp_path):
    """--compress-weight on the offload engine reads a Q4_K matrix's blocks as they are (not
    dequantized and quantized again), from disk too."""
    from flexlamps.engine.executors.offloaded import OffloadExecutor
    from flexlamps.models.description import model_spec
    from placement import Policy, TierSplit

    reader = GGUFReader(kquant_gguf)
    all_gpu = TierSplit(gpu=1, cpu=0, disk=0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0, cpu=0, disk=1), cache=all_gpu,
                    activations=all_gpu, compress_weight=True)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=2**30, cpu_mem=2**30, offload_dir=tmp_path / "off", dtype=torch.bfloat16)
    try:
        spec = next(s for s in ex.specs if s.name == "layers.1.down_proj")
        assert ex.tiers[spec.name] == "disk"
        fetched, staged = ex.store.fetch(ex.layer_names[1])
        ex.store.release(staged)
        want = reader.read_int4(spec, torch.bfloat16).dequantize()
        assert torch.equal(fetched["layers.1.down_proj"].dequantize().cpu(), want)  # fetched to the compute device
    finally:
        ex.close()
