"""MoE GGUF files (llama.cpp's names, written by the `gguf` package from tiny HF checkpoints)
load as the same model: every weight equals the HF checkpoint's, logits equal; quantized
stacked experts read one expert at a time, each its own slab's values, kept as blocks."""

import pytest
import torch

from flexlamps.models.loading.checkpoint import GGUFReader, read_all
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from tests.checkpoints import GGUF_MOE_OVERRIDES, make_checkpoint
from tests.decoder_gguf import write_decoder_gguf
from tests.gguf_models import prefill_and_decode_logits
from tests.moe_gguf import write_deepseek2_gguf


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_gguf_is_the_hf_model(kind, tmp_path):
    folder = make_checkpoint(tmp_path / kind, kind, **GGUF_MOE_OVERRIDES[kind])
    gguf_reader = GGUFReader(write_decoder_gguf(folder, tmp_path / f"{kind}.gguf"), cache_dir=tmp_path / "cache")
    hf_reader = open_checkpoint(folder)
    ours, want = gguf_reader.config, hf_reader.config
    assert (ours.model_type, ours.moe) == (want.model_type, want.moe)
    hf_weights, gguf_weights = read_all(hf_reader, torch.float32), read_all(gguf_reader, torch.float32)
    for spec in weight_specs(hf_reader.config):
        assert torch.equal(gguf_weights[spec.name], hf_weights[spec.name]), spec.name
    ours = prefill_and_decode_logits(gguf_weights, gguf_reader, torch.float32, steps=8)
    ref = prefill_and_decode_logits(hf_weights, hf_reader, torch.float32, steps=8)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.parametrize("kind,gating", [("deepseek_v2", None), ("deepseek_v2_grouped", 1)])
def test_deepseek2_gguf_is_the_hf_model(kind, gating, tmp_path):
    """llama.cpp's deepseek2 layout (MLA's kv_b_proj split into attn_k_b / attn_v_b, stacked
    experts, group routing metadata) gives back the HF checkpoint's weights and logits."""
    folder = make_checkpoint(tmp_path / kind, kind)
    gguf_reader = GGUFReader(write_deepseek2_gguf(folder, tmp_path / f"{kind}.gguf", gating), cache_dir=tmp_path / "c")
    hf_reader = open_checkpoint(folder)
    assert (gguf_reader.config.mla, gguf_reader.config.moe) == (hf_reader.config.mla, hf_reader.config.moe)
    hf_weights, gguf_weights = read_all(hf_reader, torch.float32), read_all(gguf_reader, torch.float32)
    for spec in weight_specs(hf_reader.config):
        assert torch.equal(gguf_weights[spec.name], hf_weights[spec.name]), spec.name
    ours = prefill_and_decode_logits(gguf_weights, gguf_reader, torch.float32, steps=8)
    ref = prefill_and_decode_logits(hf_weights, hf_reader, torch.float32, steps=8)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


def test_quantized_stacked_experts_read_one_slab_each(tmp_path):
    import gguf
    import numpy as np

    folder = make_checkpoint(tmp_path / "mixtral", "mixtral", **GGUF_MOE_OVERRIDES["mixtral"])  # experts in blocks
    path = write_decoder_gguf(folder, tmp_path / "q8.gguf", quantize_experts="Q8_0")
    reader = GGUFReader(path, cache_dir=tmp_path / "cache")
    stacked = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}["blk.1.ffn_gate_exps.weight"]
    assert stacked.tensor_type.name == "Q8_0"
    values = gguf.quants.dequantize(stacked.data, stacked.tensor_type)  # (E, F, H)
    spec = next(s for s in weight_specs(reader.config) if s.name == "layers.1.experts.3.gate_proj")
    assert torch.equal(reader.read(spec, torch.float32), torch.from_numpy(np.array(values[3], dtype=np.float32)))
    kept = reader.read_int8(spec, torch.bfloat16)  # Q8_0 blocks computed in place: this expert's, to bf16 scales
    want = reader.read(spec, torch.float32)
    assert kept is not None and kept.shape == spec.shape
    torch.testing.assert_close(kept.dequantize(torch.float32), want, rtol=0, atol=2**-7 * want.abs().max().item())


def test_gpt_oss_gguf_keeps_mxfp4_experts_and_is_the_hf_model(tmp_path):
    """llama.cpp's gpt-oss layout (MXFP4 ffn_*_exps in ggml's block order, expert biases, router bias,
    sinks, post_attention_norm): experts read as Mxfp4Weight with the HF checkpoint's values,
    every other weight equal, logits equal."""
    from quant.mxfp4 import Mxfp4Weight
    from tests.moe_gguf import write_gpt_oss_gguf

    folder = make_checkpoint(tmp_path / "gpt_oss", "gpt_oss_mxfp4")
    gguf_reader = GGUFReader(write_gpt_oss_gguf(folder, tmp_path / "gpt-oss.gguf"), cache_dir=tmp_path / "c")
    hf_reader = open_checkpoint(folder)
    for field in ("moe", "attention", "rope_theta", "rope_scaling", "head_dim", "tie_word_embeddings", "qkv_bias"):
        assert getattr(gguf_reader.config, field) == getattr(hf_reader.config, field), field
    hf_weights, gguf_weights = read_all(hf_reader, torch.float32), read_all(gguf_reader, torch.float32)
    for spec in weight_specs(hf_reader.config):
        ours, want = gguf_weights[spec.name], hf_weights[spec.name]
        if isinstance(want, Mxfp4Weight):
            assert isinstance(ours, Mxfp4Weight) and torch.equal(ours.dequantize(), want.dequantize()), spec.name
        else:
            assert torch.equal(ours, want), spec.name
    ours = prefill_and_decode_logits(gguf_weights, gguf_reader, torch.float32, steps=8)
    ref = prefill_and_decode_logits(hf_weights, hf_reader, torch.float32, steps=8)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


def test_q8_experts_offloaded_are_read_dense_and_run_as_in_memory(tmp_path):
    """The offload executor keeps no GGUF block as it is but 4-bit ones under --compress-weight
    (`stored_weights`): Q8_0 experts are read dequantized in the compute dtype on every tier (never
    an `Int8Weight`, which only the in-memory engine multiplies in place), and the run equals the
    in-memory engine on those dense weights bit for bit."""
    from flexlamps.engine.executors.in_memory import InMemoryExecutor
    from flexlamps.engine.executors.offloaded import OffloadExecutor
    from flexlamps.models.description import model_spec
    from placement import Policy, TierSplit
    from quant.int8_weight import Int8Weight
    from tests.family_models import our_run, prompt_ids

    folder = make_checkpoint(tmp_path / "mixtral", "mixtral", **GGUF_MOE_OVERRIDES["mixtral"])  # experts in blocks
    path = write_decoder_gguf(folder, tmp_path / "q8.gguf", quantize_experts="Q8_0")
    reader = GGUFReader(path, cache_dir=tmp_path / "c")
    assert "int8" in reader.layer_block_kinds
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.3, cpu=0.3, disk=0.4),
                    cache=TierSplit(gpu=1, cpu=0, disk=0), activations=TierSplit(gpu=1, cpu=0, disk=0))
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=2**30, cpu_mem=2**30, offload_dir=tmp_path / "offload")
    try:
        assert set(ex.tiers.values()) == {"gpu", "cpu", "disk"}
        experts = [s.name for s in ex.specs if ".experts." in s.name]
        fetched, staged = ex.store.fetch(experts)
        ex.store.release(staged)
        assert not any(isinstance(w, Int8Weight) for w in fetched.values())
        ids = prompt_ids(reader.config.vocab_size)
        tokens = [torch.full((2, 1), 5 + i) for i in range(6)]
        got = our_run(ex, ids, tokens)
    finally:
        ex.close()
    want = our_run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32), ids, tokens)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
