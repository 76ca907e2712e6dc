"""GGUF metadata -> config (flexlamps.models.loading.gguf_config): the architectures read are the
family registry's, float32 metadata reads back as the decimals written, llama.cpp's fixed values
hold, and what we cannot apply is refused by name."""

import pytest

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from flexlamps.models.families import families
from flexlamps.models.loading.gguf_config import DECODER_ARCHITECTURES, as_written, decoder_hf_config
from flexlamps.models.loading.gguf_hybrid import HYBRID_ARCHITECTURES

OTHER_READERS = {"deepseek2", "gpt-oss"}  # gguf_moe's own configs


def test_the_registry_names_exactly_the_architectures_read():
    declared = {a for fam in families() for a in fam.gguf_architectures}
    assert declared == set(DECODER_ARCHITECTURES) | OTHER_READERS | set(HYBRID_ARCHITECTURES)


def _fields(arch: str, **extra) -> dict:
    f = {"general.architecture": arch, f"{arch}.embedding_length": 64, f"{arch}.block_count": 4,
         f"{arch}.feed_forward_length": 96, f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
         f"{arch}.attention.layer_norm_rms_epsilon": 9.999999974752427e-07, "tokenizer.ggml.tokens": ["a"] * 10}
    return {**f, **{f"{arch}.{k}": v for k, v in extra.items()}}


def _config(arch: str, types=(), values=None, **extra) -> ModelConfig:
    types = {name: "F32" for name in ("token_embd.weight", *types)}
    return ModelConfig.from_hf(decoder_hf_config(_fields(arch, **extra), types, values or (lambda name: [])))


def test_float32_metadata_reads_as_the_decimal_written():
    assert as_written({"eps": 9.999999974752427e-07, "n": 3, "x": 0.1})["eps"] == 1e-06
    assert _config("llama").norm_eps == 1e-06


def test_llama_cpp_fixed_values():
    smollm3 = _config("smollm3")
    assert smollm3.attention.rope_layers == (True, True, True, False)  # no rope on every 4th layer
    gemma3 = _config("gemma3", **{"attention.sliding_window": 8})
    assert gemma3.attention.window == 8 and gemma3.attention.scale == 16 ** -0.5  # pattern 6: all 4 slide
    gemma2 = _config("gemma2")
    assert gemma2.attention.softcap == 50.0 and gemma2.decoder.logit_softcap == 30.0
    assert gemma2.attention.window == 4096 and gemma2.attention.window_layers == (True, False, True, False)
    granite = _config("granite", logit_scale=2.0)
    assert granite.attention.scale == 16 ** -0.5  # no attention.scale: llama.cpp's 1/sqrt(head_dim)


def test_phi3_longrope_from_its_factor_tensors():
    values = {"rope_factors_long.weight": [2.0, 3.0], "rope_factors_short.weight": [1.0, 1.5]}
    cfg = _config("phi3", types=values, values=values.__getitem__, context_length=64,
                  **{"rope.dimension_count": 4, "rope.scaling.original_context_length": 16})
    assert cfg.attention.rotary_dim == 4
    assert cfg.rope_scaling == {"rope_type": "longrope", "long_factor": [2.0, 3.0], "short_factor": [1.0, 1.5],
                                "original_max_position_embeddings": 16}


@pytest.mark.parametrize("arch,types,extra,named", [
    ("llama", ("rope_freqs.weight",), {}, "rope_freqs.weight"),
    ("gemma2", ("output.weight",), {}, "output.weight"),
    ("llama", (), {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                   "rope.scaling.original_context_length": 16, "rope.scaling.yarn_attn_factor": 2.0},
     "yarn_attn_factor"),
    ("qwen3", (), {"rope.scaling.type": "longrope"}, "longrope"),
    ("gemma2", (), {"rope.freq_base_swa": 5.0}, "freq_base_swa"),
    ("qwen3", ("blk.0.attn_q.bias",), {}, "output projection"),
    ("glm4moe", (), {"expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 8,
                     "expert_gating_func": 1}, "expert_gating_func"),
])
def test_what_cannot_be_applied_is_refused_by_name(arch, types, extra, named):
    with pytest.raises(UnsupportedModelError, match=named):
        _config(arch, types=types, **extra)
