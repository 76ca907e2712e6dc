"""GGUF files of the hybrid models (written by the `gguf` package from the tiny Qwen3-Next / Qwen3.5
checkpoints as llama.cpp's convert_hf_to_gguf.py lays them out: tests/hybrid_gguf.py) load as the
HF checkpoint: the same ModelConfig from the metadata, every weight the forward uses equal, bit-equal
float32 logits; offloaded over three tiers equal to in memory."""

import dataclasses

import numpy as np
import pytest
import torch

from flexlamps.models.loading.checkpoint import CheckpointError, GGUFReader, read_all
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from tests.gguf_models import prefill_and_decode_logits
from tests.hybrid_gguf import write_hybrid_gguf
from tests.checkpoints import GROUPS

_PLUS_ONE = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "norm")


def _as_used(spec, w: torch.Tensor) -> torch.Tensor:
    """The value the forward computes with: `1 + w` for the zero-centred norms, `-exp(A_log)`."""
    if spec.local_name in _PLUS_ONE or spec.name == "norm":
        return 1.0 + w
    return -w.float().exp() if spec.local_name == "A_log" else w


def assert_hybrid_gguf_is_the_hf_model(path, folder, cache_dir) -> None:
    gguf_reader, hf_reader = GGUFReader(path, cache_dir=cache_dir), open_checkpoint(folder)
    assert gguf_reader.config == hf_reader.config
    ours, want = read_all(gguf_reader, torch.float32), read_all(hf_reader, torch.float32)
    for spec in weight_specs(hf_reader.config):
        assert torch.equal(_as_used(spec, ours[spec.name]), _as_used(spec, want[spec.name])), spec.name
    got = prefill_and_decode_logits(ours, gguf_reader, torch.float32, steps=8)
    ref = prefill_and_decode_logits(want, hf_reader, torch.float32, steps=8)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))


@pytest.mark.parametrize("kind", sorted(GROUPS["hybrid"]))
def test_hybrid_gguf_is_the_hf_model(hybrid_models, kind, tmp_path):
    """Qwen3-Next (grouped q/k/v/z split by the converter, a dense layer in the wide one) and Qwen3.5
    (value heads tiled: 4 over 2 key heads, 6 over 2), both widths."""
    folder = hybrid_models[kind]
    assert_hybrid_gguf_is_the_hf_model(write_hybrid_gguf(folder, tmp_path / f"{kind}.gguf"), folder, tmp_path / "c")


def test_multi_token_prediction_blocks_are_skipped(hybrid_models, tmp_path):
    """llama.cpp counts the MTP layer in block_count and stores it as the next block: not run, not
    an unread tensor; a tensor of a real layer no weight reads still is."""
    folder = hybrid_models["qwen3_next"]
    mtp = {"blk.4.nextn.eh_proj.weight": np.zeros((48, 96), np.float32),
           "blk.4.attn_norm.weight": np.ones(48, np.float32)}
    path = write_hybrid_gguf(folder, tmp_path / "mtp.gguf", extra=mtp, mtp_layers=1)
    assert_hybrid_gguf_is_the_hf_model(path, folder, tmp_path / "c")
    extra = {"blk.0.ffn_gate.weight": np.zeros((80, 48), np.float32)}
    path = write_hybrid_gguf(folder, tmp_path / "extra.gguf", extra=extra)
    with pytest.raises(CheckpointError, match=r"blk\.0\.ffn_gate\.weight is not read by flexlamps' qwen3_next"):
        GGUFReader(path, cache_dir=tmp_path / "c")


def test_qwen35moe_is_refused_by_name(tmp_path):
    import gguf

    from flexlamps.models.config import UnsupportedModelError
    from tests.gguf_models import add_made_up_vocabulary, finish_gguf

    w = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "qwen35moe")
    add_made_up_vocabulary(w, 8)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    with pytest.raises(UnsupportedModelError, match="'qwen35moe'.*Qwen3.5-MoE"):
        GGUFReader(finish_gguf(w, tmp_path / "moe.gguf"), cache_dir=tmp_path / "c")


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_text_wide"])
def test_hybrid_gguf_offloaded_over_three_tiers_equals_in_memory(hybrid_models, kind, tmp_path):
    from placement import Policy, TierSplit
    from tests.family_models import assert_offloaded_equals_in_memory, prompt_ids

    reader = GGUFReader(write_hybrid_gguf(hybrid_models[kind], tmp_path / f"{kind}.gguf"), cache_dir=tmp_path / "c")
    ids = prompt_ids(reader.config.vocab_size)
    tokens = [torch.full((2, 1), t) for t in (5, 9, 17, 3, 11, 40)]
    on_gpu = TierSplit(gpu=1, cpu=0, disk=0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.3, cpu=0.3, disk=0.4),
                    cache=TierSplit(gpu=0.5, cpu=0.5, disk=0), activations=on_gpu)
    assert_offloaded_equals_in_memory(reader, policy, ids, tokens, tmp_path / "off")


@pytest.mark.parametrize("kind", ["qwen3_next_wide", "qwen3_5_text_wide"])
def test_q8_0_hybrid_gguf_keeps_its_blocks_where_nothing_was_rearranged(hybrid_models, kind, tmp_path):
    """A Q8_0 file (every matrix of 96 inputs): each weight within Q8_0's rounding of the HF one (a
    row or head out of place is off by the weights themselves); in bf16 with blocks in place, the
    matrices the converter rearranged come back dense and the others as their int8 blocks."""
    from quant.int8_weight import Int8Weight

    path = write_hybrid_gguf(hybrid_models[kind], tmp_path / f"{kind}.gguf", quantize="Q8_0")
    reader, hf = GGUFReader(path, cache_dir=tmp_path / "c"), open_checkpoint(hybrid_models[kind])
    assert dataclasses.replace(reader.config, storage=hf.config.storage) == hf.config  # stored as Q8_0, not fp32
    ours, want = read_all(reader, torch.float32), read_all(hf, torch.float32)
    for spec in weight_specs(hf.config):  # half a step of 1/127 of the block's largest, and the fp16 step
        a, b = _as_used(spec, ours[spec.name]), _as_used(spec, want[spec.name])
        assert (a - b).abs().max() <= b.abs().max() / 200, spec.name
    kept = read_all(reader, torch.bfloat16, int4_in_place=True)
    rebuilt = ({"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"} if kind.startswith("qwen3_5")
               else {"in_proj_qkvz"})
    for spec in weight_specs(hf.config):
        if spec.role == "linear" and spec.layer is not None and spec.shape[-1] % 32 == 0:  # quantized ones
            assert isinstance(kept[spec.name], Int8Weight) != (spec.local_name in rebuilt), spec.name
