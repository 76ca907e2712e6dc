"""ModelSpec sizes against the real tensors transformers allocates (on the meta device)."""

import json

import pytest

from tests.described import described
from flexlamps.models.presets import MODEL_CONFIGS
from placement import ModelSpec, model_preset
from tests.checkpoints import checkpoint_fields

# one kind of each layout the planner sizes, from the tests' one table (tests/checkpoints.py), by model type
_KINDS = {"llama": "llama_gqa", "mistral": "mistral_head_dim", "qwen2": "qwen2", "opt": "opt",
          "deepseek_v3": "deepseek_v3", "deepseek_v32": "deepseek_v32"}
TINY_CONFIGS = {model_type: {**checkpoint_fields(kind), "vocab_size": 128} for model_type, kind in _KINDS.items()}


def _meta_model(config: dict):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_config)


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_parameter_counts_match_transformers(model_type):
    config = TINY_CONFIGS[model_type]
    model = _meta_model(config)
    spec = described(config)[1]
    # tied weights are counted once; persistent buffers (MoE score bias) are checkpoint tensors
    saved = set(model.state_dict())
    total = sum(p.numel() for p in model.parameters())
    total += sum(b.numel() for name, b in model.named_buffers() if name in saved)
    predicted = spec.total_weight_bytes() / spec.dtype_bytes
    assert predicted == pytest.approx(total, abs=0.5)


def test_dense_layer_count_matches_transformers_layer():
    config = TINY_CONFIGS["llama"]
    layer = _meta_model(config).model.layers[0]
    spec = described(config)[1]
    assert spec.layer_param_count() == sum(p.numel() for p in layer.parameters())


def test_cache_bytes_per_architecture():
    opt = model_preset("opt-30b")  # MHA: K and V of every head, fp16
    assert opt.cache_bytes_per_token_per_layer() == 2 * 7168 * 2
    llama3 = model_preset("llama-3-8b")  # GQA: 8 KV heads of 128
    assert llama3.cache_bytes_per_token_per_layer() == 2 * 8 * 128 * 2
    mla = model_preset("deepseek-v3.2-attn")  # latent 512 + rope key 64, bf16
    assert mla.cache_bytes_per_token_per_layer() == (512 + 64) * 2
    assert mla.indexer_bytes_per_token_per_layer() == 128 * 2
    assert mla.attended_entries(100_000) == 2048  # sparse selection caps the reads


def test_presets_have_known_sizes():
    # published parameter counts, within 2% (embeddings included)
    expected = {"opt-30b": 30e9, "opt-175b": 175e9, "llama-2-7b": 6.74e9, "llama-3-8b": 8.03e9,
                "llama-2-70b": 69e9, "smollm2-135m": 135e6, "deepseek-v3.2": 671e9}
    for name, params in expected.items():
        spec = model_preset(name)
        assert spec.total_weight_bytes() / spec.dtype_bytes == pytest.approx(params, rel=0.02), name
    assert set(expected) <= set(MODEL_CONFIGS)


def test_preset_names_are_forgiving():
    assert model_preset("facebook/opt-30b") == model_preset("OPT-30B")
    with pytest.raises(KeyError, match="unknown model preset"):
        model_preset("gpt-5")


def test_json_round_trip_and_bad_configs():
    spec = model_preset("deepseek-v3.2")
    assert ModelSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="not supported"):
        described({"model_type": "gpt2"})[1]
    with pytest.raises(ValueError, match="lacks the field 'num_attention_heads'"):
        described({"model_type": "llama", "num_hidden_layers": 2})[1]
    with pytest.raises(ValueError, match="unknown field"):
        ModelSpec.from_dict(dict(json.loads(spec.to_json()), colour="red"))


def test_moe_micro_batches_touch_only_their_experts():
    spec = model_preset("deepseek-v3.2")
    one = spec.weight_bytes_touched_per_layer(1)
    assert one == pytest.approx(spec.layer_param_count(active_only=True) * spec.dtype_bytes)
    touched = [spec.weight_bytes_touched_per_layer(n) for n in (1, 4, 64, 4096)]
    assert touched == sorted(touched) and touched[-1] == pytest.approx(spec.weight_bytes_per_layer())
    dense = model_preset("llama-3-8b")
    assert dense.weight_bytes_touched_per_layer(1) == dense.weight_bytes_per_layer()


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_vector_params_are_the_non_matrix_tensors(model_type):
    config = TINY_CONFIGS[model_type]
    model = _meta_model(config)
    spec = described(config)[1]
    saved = set(model.state_dict())
    vectors = sum(t.numel() for name, t in list(model.named_parameters()) + list(model.named_buffers())
                  if name in saved and ".layers." in f".{name}" and t.dim() == 1)
    assert spec.vector_param_count() * spec.num_layers == pytest.approx(vectors)


def test_compressed_sizes_match_the_quant_package():
    quant_config = pytest.importorskip("quant.config")
    from placement import CompressionSpec

    for dtype, dtype_bytes in (("float16", 2), ("float32", 4)):
        for bits in (4, 8):
            packed = quant_config.QuantConfig(bits=bits, group_size=64).packed_nbytes(
                (128, 256), dtype)
            ours = CompressionSpec(num_bits=bits, group_size=64).bytes_per_element(dtype_bytes)
            assert ours * 128 * 256 == packed


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "opt"])
def test_sizes_match_the_engines_weight_specs(model_type):
    """The planner sizes exactly the tensors the engine allocates (flexlamps.models)."""
    weight_specs = pytest.importorskip("flexlamps.models.weight_specs")
    from flexlamps.models.config import ModelConfig

    config = TINY_CONFIGS[model_type]
    specs = weight_specs.weight_specs(ModelConfig.from_hf(config))
    spec = described(config)[1]
    for layer in range(spec.num_layers):
        tensors = [s for s in specs if s.layer == layer]
        assert sum(s.numel for s in tensors) == spec.layer_param_count()
        assert sum(s.numel for s in tensors if s.role != "linear") == spec.vector_param_count()
    embeddings = sum(s.numel for s in specs if s.layer is None)
    assert embeddings * spec.dtype_bytes == spec.embedding_bytes()


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v32", "llama"])
def test_uncompressed_matrices_are_those_the_engine_keeps_dense(model_type):
    """With weight compression on, the engine quantizes only "linear" matrices: MLA's kv_b_proj
    (absorbed), the indexer's head weights and the router stay as they are, and the planner
    sizes them so (a plan with compressed weights would otherwise be 10-15% short)."""
    weight_specs = pytest.importorskip("flexlamps.models.weight_specs")
    from flexlamps.models.config import ModelConfig

    config = TINY_CONFIGS[model_type]
    specs = weight_specs.weight_specs(ModelConfig.from_hf(config))
    spec = described(config)[1]
    kept = sum(s.numel for s in specs if s.layer is not None and len(s.shape) == 2 and s.role != "linear")
    assert spec.uncompressed_matrix_param_count() * spec.num_layers == pytest.approx(kept)


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_layer_matrix_shapes_are_the_layers_weight_matrices(model_type):
    config = TINY_CONFIGS[model_type]
    model = _meta_model(config).model
    layers = model.decoder.layers if model_type == "opt" else model.layers
    layer = layers[-1]  # the MoE layer where there is one
    spec = described(config)[1]
    real = [tuple(p.shape) for p in layer.parameters() if p.dim() == 2]
    ours = spec.layer_matrix_shapes()
    if spec.num_experts:  # one routed expert stands for all; the router and indexer are left out
        assert set(ours) <= set(real)
    else:
        assert sorted(ours) == sorted(real)
