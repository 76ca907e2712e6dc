"""GGUF files of the LLaMA-like families (written by the `gguf` package from tiny HF checkpoints as
llama.cpp's convert_hf_to_gguf.py lays them out: tests/decoder_gguf.py) load as the HF checkpoint:
the same ModelConfig from the metadata, every weight equal, bit-equal logits (float32)."""

import pytest

from tests.decoder_gguf import write_decoder_gguf
from tests.checkpoints import GGUF_FIELDS, make_checkpoint
from tests.gguf_models import assert_gguf_is_the_hf_model

@pytest.mark.parametrize("kind", sorted(GGUF_FIELDS))
@pytest.mark.parametrize("tied", [False, True])
def test_decoder_gguf_is_the_hf_model(kind, tied, tmp_path):
    if kind == "gemma2" and not tied:
        pytest.skip("llama.cpp's Gemma-2 always ties its head")
    folder = make_checkpoint(tmp_path / kind, GGUF_FIELDS[kind], tied=tied)
    assert_gguf_is_the_hf_model(write_decoder_gguf(folder, tmp_path / f"{kind}.gguf"), folder, tmp_path / "c")


@pytest.mark.parametrize("kind", ["olmoe", "glm4_moe"])
def test_moe_decoder_gguf_is_the_hf_model(kind, tmp_path):
    folder = make_checkpoint(tmp_path / kind, kind)
    assert_gguf_is_the_hf_model(write_decoder_gguf(folder, tmp_path / f"{kind}.gguf"), folder, tmp_path / "c")


def test_a_tensor_no_weight_reads_is_refused_when_the_file_opens(tmp_path):
    """No silent drops in GGUF files either: a tensor the forward would skip (a Gemma norm in a
    Qwen3 file) is named; Phi-3's rope factors (read into the config) are not such a tensor."""
    import numpy as np

    from flexlamps.models.loading.checkpoint import CheckpointError, GGUFReader

    folder = make_checkpoint(tmp_path / "qwen3", GGUF_FIELDS["qwen3"])
    extra = {"blk.1.post_ffw_norm.weight": np.ones(64, np.float32)}
    path = write_decoder_gguf(folder, tmp_path / "extra.gguf", extra=extra)
    with pytest.raises(CheckpointError, match=r"blk\.1\.post_ffw_norm\.weight is not read by flexlamps' qwen3 model"):
        GGUFReader(path, cache_dir=tmp_path / "c")


@pytest.mark.parametrize("kind", ["gemma3_text", "phi3"])
def test_gguf_offloaded_over_three_tiers_equals_in_memory(kind, tmp_path):
    """A GGUF's weights (Gemma's shifted norms, Phi-3's stacked projections) streamed from gpu / cpu /
    disk give the in-memory engine's logits bit for bit."""
    import torch

    from flexlamps.models.loading.checkpoint import GGUFReader
    from placement import Policy, TierSplit
    from tests.family_models import assert_offloaded_equals_in_memory, prompt_ids

    folder = make_checkpoint(tmp_path / kind, GGUF_FIELDS[kind], seed=2)
    reader = GGUFReader(write_decoder_gguf(folder, tmp_path / f"{kind}.gguf"), cache_dir=tmp_path / "c")
    ids = prompt_ids(reader.config.vocab_size)
    tokens = [torch.full((2, 1), t) for t in (5, 9, 17, 3, 11, 40, 7, 2)]  # fed as decode steps, past the windows
    on_gpu = TierSplit(gpu=1, cpu=0, disk=0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.3, cpu=0.3, disk=0.4),
                    cache=on_gpu, activations=on_gpu)
    assert_offloaded_equals_in_memory(reader, policy, ids, tokens, tmp_path / "off")
